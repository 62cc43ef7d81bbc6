"""The `--smoke` flag every script in benchmarks/ has, so that none of them can rot unnoticed.

A benchmark is run by hand, rarely, and its published figures are only worth something
while the script still runs. `--smoke` runs the same code path on tiny settings (seconds,
against sim engines; where a script needs a real vLLM engine or a GPU, a sim engine stands
in, or the part is skipped with a printed reason), and tests/test_benchmarks.py runs every
script that way. Figures printed in smoke mode mean nothing.

The leading underscore keeps this helper out of that test's `benchmarks/*.py` set.
"""

from __future__ import annotations

import argparse
from typing import Any

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
