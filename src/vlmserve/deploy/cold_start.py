"""A replica's cold start broken into phases, from the engine's own log lines.

vLLM 0.32 logs, each line stamped `INFO MM-DD HH:MM:SS`:
- `Loading weights took X seconds` (or `Model loading took ... GiB memory and X seconds`): the
  weights are in memory (X: reading them alone; the time before is imports and model init);
- `init engine (profile, create kv cache, warmup model) took X s`: the engine core is ready
  (memory profiling, KV cache allocation, warm-up, any torch.compile or graph capture);
- `Starting vLLM server on ...`: the HTTP server listens.
The sim engine's cold start logs the first two in the same words and format (engines/sim/server.py).

From the process start (the supervisor's clock) and those stamps: process start → weights loaded
→ engine ready → listening → ready (the supervisor's checks passed). Stamps have whole seconds,
so each phase is ±1 s; the engine's own "took" figures are kept beside them at full precision.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

_STAMP = re.compile(r"(?:INFO|WARNING)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_WEIGHTS = re.compile(r"(?:Loading weights took ([0-9.]+) seconds|Model loading took [0-9.]+ GiB memory and ([0-9.]+) seconds)")
_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
_LISTENING = "Starting vLLM server on"
LOG_READ_MAX = 4 << 20
"""The most of a replica's log read for one start (from where that start's lines begin)."""


def _stamp(line: str, year: int) -> float | None:
    match = _STAMP.search(line)
    if match is None:
        return None
    month, day, hour, minute, second = (int(group) for group in match.groups())
    try:
        return time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def log_size(path: Path) -> int:
    """Where the next start's lines will begin."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def cold_start_phases(log_path: Path, offset: int, started_at: float, ready_at: float) -> dict[str, float]:
    """Phase name -> seconds for the start whose lines begin at `offset`; phases whose line is
    missing are left out (an engine that logs none gives only `start_to_ready_s`)."""
    phases: dict[str, float] = {"start_to_ready_s": round(ready_at - started_at, 3)}
    try:
        with log_path.open("rb") as log:
            log.seek(offset)
            text = log.read(LOG_READ_MAX).decode("utf-8", "replace")
    except OSError:
        return phases
    year = time.localtime(started_at).tm_year
    marks: dict[str, float] = {}
    for line in text.splitlines():
        if "weights" not in marks and (weights := _WEIGHTS.search(line)):
            phases["weights_read_s"] = float(weights.group(1) or weights.group(2))
            if (at := _stamp(line, year)) is not None:
                marks["weights"] = at
        elif "engine" not in marks and (engine := _ENGINE.search(line)):
            phases["engine_init_s"] = float(engine.group(1))
            if (at := _stamp(line, year)) is not None:
                marks["engine"] = at
        elif "listening" not in marks and _LISTENING in line and (at := _stamp(line, year)) is not None:
            marks["listening"] = at
    previous, previous_name = started_at, "start"
    for name in ("weights", "engine", "listening"):
        if name in marks:
            phases[f"{previous_name}_to_{name}_s"] = round(max(0.0, marks[name] - previous), 3)
            previous, previous_name = marks[name], name
    if previous_name != "start":
        phases[f"{previous_name}_to_ready_s"] = round(max(0.0, ready_at - previous), 3)
    return phases
