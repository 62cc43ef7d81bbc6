"""Shared fixtures. Fixtures that start real engines live in the test packages that need them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT

pytest_plugins = ["tests.hostile_report", "tests.helpers.bench_fixtures", "tests.helpers.gateway_fixtures",
                  "tests.helpers.redis_server"]

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
