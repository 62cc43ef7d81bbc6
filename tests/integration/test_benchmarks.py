"""Every script in benchmarks/ runs in `--smoke` mode, so a published figure stays reproducible.

The set is the directory's `*.py` but the shared helper module `_smoke.py` (`_uvloop_pump.py`,
a route that gateway_overhead.py starts, runs too): a new script without `--smoke`
fails here (argparse rejects the flag) instead of rotting quietly until someone reruns it.
Only success is checked, never speed: smoke figures mean nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.mark.parametrize("script", [_param(path) for path in BENCHMARKS])
def test_benchmark_smoke(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "VLMSERVE_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, str(script), "--smoke"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script.name} --smoke exited {result.returncode}:\n{output[-4000:]}"
    assert "smoke mode" in result.stdout, output[-2000:]
