"""Every script in benchmarks/ runs in `--smoke` mode, so a published figure stays reproducible.

The set is the directory's `*.py` but the shared helper module `_smoke.py` (`_uvloop_pump.py`,
a route that gateway_overhead.py starts, runs too): a new script without `--smoke`
fails here (argparse rejects the flag) instead of rotting quietly until someone reruns it.
Only success is checked, never speed: smoke figures mean nothing.

The smokes run two at a time (`smoke_runs`): much of a smoke is a fresh interpreter importing
its libraries, an engine starting, a client waiting on it, and nothing in a smoke depends on
speed. On the 2-core machine this file took 172 s one smoke after another and 104 s two at a
time (2026-11-27). Each script still passes or fails as its own test, with its own output.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

BENCHMARKS = sorted(path for path in (REPO_ROOT / "benchmarks").glob("*.py") if path.name != "_smoke.py")

SLOW = {
    "bench_client_capacity.py": "runs `vllm bench serve`, whose import alone takes 10 s or more",
    "bench_vs_vllm_engine.py": "runs `vllm bench serve`, whose import alone takes 10 s or more",
    "client_accuracy.py": "runs `vllm bench serve` (and AIPerf, guidellm where installed), each 5-10 s to start",
}


def _param(path: Path) -> object:
    marks = [pytest.mark.slow] if path.name in SLOW else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_every_slow_entry_names_a_script() -> None:
    """A renamed script must not silently lose its slow mark (or keep a stale one)."""
    assert set(SLOW) <= {path.name for path in BENCHMARKS}


SMOKES_AT_ONCE = 2  # the CI machine's cores


def _run_smoke(script: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "VLMSERVE_HOME": str(workdir / "home"),
    }
    return subprocess.run(
        [sys.executable, str(script), "--smoke", *extra], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, subprocess.CompletedProcess[str] | BaseException]:
    """The `--smoke` run of every script this session selected (so `-k gateway_overhead` runs one),
    SMOKES_AT_ONCE at a time; a script name maps to its finished process, or to the exception
    that stopped it (a timeout), which its own test then reports."""
    selected = [
        item.callspec.params["script"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_benchmark_smoke"
    ]
    with ThreadPoolExecutor(max_workers=SMOKES_AT_ONCE) as pool:
        futures = {script.name: pool.submit(_run_smoke, script, tmp_path_factory.mktemp(script.stem)) for script in selected}
    return {name: future.exception() or future.result() for name, future in futures.items()}


@pytest.mark.parametrize("script", [_param(path) for path in BENCHMARKS])
def test_benchmark_smoke(script: Path, smoke_runs: dict[str, subprocess.CompletedProcess[str] | BaseException]) -> None:
    result = smoke_runs[script.name]
    if isinstance(result, BaseException):
        raise result
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script.name} --smoke exited {result.returncode}:\n{output[-4000:]}"
    assert "smoke mode" in result.stdout, output[-2000:]


def test_gateway_overhead_counts_system_calls_per_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--syscalls` for real where perf can count (root, Linux with tracepoints; the CI image has no perf)."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    problem = importlib.import_module("gateway_overhead").syscall_tracing_problem()
    if problem is not None:
        pytest.skip(problem)
    out = tmp_path / "overhead.json"
    done = _run_smoke(
        REPO_ROOT / "benchmarks" / "gateway_overhead.py", tmp_path, "--syscalls", "--only", "vlmserve", "--json-out", str(out)
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "system calls per request" in done.stdout
    counts = json.loads(out.read_text())["syscalls_per_request"]["vlmserve"]
    # a streamed request through the gateway reads and writes sockets: some calls of each per request
    assert counts["read"] >= 1 and counts["write"] >= 1, counts
