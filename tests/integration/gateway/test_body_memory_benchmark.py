"""benchmarks/gateway_body_memory.py --smoke runs and measures both body shapes."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT


def test_body_memory_benchmark_smoke() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gateway_body_memory.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [row for row in done.stdout.strip().splitlines() if not row.startswith("smoke")]
    assert rows[0].startswith("case") and [row.split()[0] for row in rows[1:]] == ["many-small", "one-string"]
