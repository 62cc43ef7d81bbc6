"""The `--smoke` flag every script in benchmarks/ has, so that none of them can rot unnoticed.

A benchmark is run by hand, rarely, and its published figures are only worth something
while the script still runs. `--smoke` runs the same code path on tiny settings (seconds,
against sim engines; where a script needs a real vLLM engine or a GPU, a sim engine stands
in, or the part is skipped with a printed reason), and tests/integration/test_benchmarks.py runs every
script that way. Figures printed in smoke mode mean nothing.

The leading underscore keeps this helper out of that test's `benchmarks/*.py` set.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

SMOKE_HELP = "run for seconds on tiny settings against sim engines to check the script works (figures mean nothing)"


def parse_args(parser: argparse.ArgumentParser, **smoke_defaults: Any) -> argparse.Namespace:
    """Add `--smoke` and parse; with it, `smoke_defaults` replace the defaults (flags given still win)."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**smoke_defaults)
        args = parser.parse_args()
        print("smoke mode: tiny settings, figures mean nothing", flush=True)
    return args


def skip(reason: str) -> None:
    """Say which part a smoke run leaves out, and why, so a reader of its output knows what was not checked."""
    print(f"smoke: skipped {reason}", flush=True)


def wait_healthy(
    url: str, process: subprocess.Popen | None = None, timeout_s: float = 60.0, log_path: Path | None = None
) -> None:
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
            why = (
                f"exited with {process.returncode}" if exited and process is not None else f"not healthy within {timeout_s:.0f} s"
            )
            tail = f"\n{log_path.read_text(errors='replace')[-2000:]}" if log_path is not None and log_path.exists() else ""
            raise SystemExit(f"{url}: {why}{tail}")
        time.sleep(0.1)
