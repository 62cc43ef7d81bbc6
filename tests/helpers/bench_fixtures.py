"""Fixtures for bench tests: a real sim engine (subprocess), an isolated run history, the CLI in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.sim import SimHandle, start_sim_engine

SIM_MODEL = "bench-sim"


@pytest.fixture(scope="package")
def sim() -> Iterator[SimHandle]:
    """One constant-latency sim engine shared by the bench tests (TTFT 20 ms, ITL 2 ms)."""
    with start_sim_engine(model=SIM_MODEL, ttft_ms=20, itl_ms=2, seed=1) as handle:
        yield handle


@pytest.fixture(autouse=True)
def vlmserve_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own run history."""
    home = tmp_path / "home"
    monkeypatch.setenv("VLMSERVE_HOME", str(home))
    return home


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def error_line(self) -> str:
        lines = [line for line in self.err.splitlines() if line.startswith("error:")]
        return lines[-1] if lines else ""


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """Run `vlmserve ARGS` in this process; returns exit code, stdout, stderr."""
    from vlmserve.cli import app as cli_module
    from vlmserve.cli.app import main

    built = cli_module.build_app()  # register the verbs once, not on every call
    monkeypatch.setattr(cli_module, "build_app", lambda: built)

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(arg) for arg in args])
            code = 0
        except SystemExit as done:
            code = int(done.code or 0)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def bench_args(handle: SimHandle, *extra: object) -> list[str]:
    return ["bench", "--base-url", handle.base_url, "--model", SIM_MODEL, "--no-progress", *map(str, extra)]


def write_sharegpt(path: Path, conversations: list, truncate_tail: str | None = None) -> Path:
    """A ShareGPT file; `truncate_tail` is appended raw after the last complete item (no closing bracket)."""
    text = json.dumps(conversations)
    if truncate_tail is not None:
        text = text[:-1] + ", " + truncate_tail
    path.write_text(text)
    return path
