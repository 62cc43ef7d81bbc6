"""Shared fixtures. Fixtures that start real engines live in the test packages that need them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT

pytest_plugins = [
    "tests.hostile_report",
    "tests.helpers.bench_fixtures",
    "tests.helpers.gateway_fixtures",
    "tests.helpers.redis_server",
    "tests.helpers.machine_share",
]

ARTIFACTS_DIR = REPO_ROOT / "artifacts"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests keep things a person may want to look at (screenshots, reports)."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR


@pytest.fixture
def vlmserve_cmd() -> list[str]:
    """argv prefix that runs this checkout's CLI in a subprocess."""
    return [sys.executable, "-m", "vlmserve"]


@pytest.fixture(scope="session")
def embedded_engine(tmp_path_factory: pytest.TempPathFactory):  # -> tests.helpers.engine.EmbeddedEngine
    """The ONE real embedded vLLM engine shared by every test that needs it (see tests/helpers/engine.py)."""
    from tests.helpers.engine import TraceSink, start_embedded_engine

    sink = TraceSink()  # it exports trace spans too, for the TTFT breakdown test
    try:
        with start_embedded_engine(tmp_path_factory.mktemp("embedded-engine"), trace_sink=sink) as engine:
            yield engine
    finally:
        sink.close()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLMSERVE_TEST", "1")


HEAVY_GROUP = "real-engines"  # the xdist group of every test that starts a real vLLM or a Ray cluster


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for `--dist loadgroup` (the pytest-xdist mode scripts/test runs): a test file stays on one
    worker (its module fixtures start once), and every test that starts a real vLLM or a Ray cluster
    runs on the same worker, one at a time, because two of those at once on a small machine starve
    each other past their start-up timeouts, and the session's one embedded engine starts once."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        heavy = item.get_closest_marker("engine") is not None or item.get_closest_marker("ray") is not None
        item.add_marker(pytest.mark.xdist_group(HEAVY_GROUP if heavy else item.nodeid.split("::")[0]))
