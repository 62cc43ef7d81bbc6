"""Waiting for a server a benchmark started: one loop, so every script fails the same clear way.

The leading underscore keeps this helper out of tests/test_benchmarks.py's `benchmarks/*.py` set.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_healthy(url: str, process: subprocess.Popen | None = None, timeout_s: float = 60.0,
                 log_path: Path | None = None) -> None:
    """Return once GET `url` answers 200; exit with one line (and the log's tail) if the process
    dies or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            why = f"exited with {process.returncode}" if exited and process is not None else f"not healthy within {timeout_s:.0f} s"
            tail = f"\n{log_path.read_text(errors='replace')[-2000:]}" if log_path is not None and log_path.exists() else ""
            raise SystemExit(f"{url}: {why}{tail}")
        time.sleep(0.1)
