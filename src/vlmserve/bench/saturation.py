"""Over-saturation stop: end an open-loop run once the server has fallen behind for good.

Why: past saturation an open loop's queue grows without bound, every later request waits
longer than the one before, and minutes of measuring only describe a collapse (guidellm
calls its version the over-saturation constraint). This is a *constraint* in the bench's
strategy/constraint split: it decides when to stop, nothing else.

The rule, judged at the end of every window (`window_s`):
- backlog = requests whose scheduled send time has passed − requests finished; it must have
  grown in each of the last `growing_windows` windows, to at least `min_backlog` requests and
  at least `min_growth` × what it was when the growth began;
- and the TTFT p50 of requests whose first token came in the last window must be at least
  `ttft_growth` × the TTFT p50 of the window where the growth began (a window where no first
  token came at all counts as growing: nothing is being served).

Only open loops are judged: a closed loop's queue is bounded by its users, so it cannot run
away. Once the rule fires, no new request is sent, requests in flight get `grace_s` to end,
then are cancelled (recorded as `interrupted`); the summary says `meta.stopped = "oversaturated"`
with the reason.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vlmserve.bench.interrupt import STOP_NOW, STOP_SENDING, Interrupt
from vlmserve.results.records import RequestRecord

OVERSATURATED = "oversaturated"
"""The value of `meta.stopped` for a run this constraint ended."""


@dataclass(frozen=True)
class SaturationRule:
    """Thresholds of the over-saturation stop (see the module docstring)."""

    window_s: float = 1.0
    growing_windows: int = 4
    min_backlog: int = 8
    min_growth: float = 2.0
    ttft_growth: float = 1.5
    grace_s: float = 2.0

    @classmethod
    def for_duration(cls, expected_duration_s: float | None) -> "SaturationRule":
        """Windows of a twentieth of the run (0.25 s to 2 s), so a short run can still stop early."""
        if expected_duration_s is None:
            return cls()
        return cls(window_s=min(2.0, max(0.25, expected_duration_s / 20.0)))


@dataclass
class _Window:
    backlog: int
    ttft_p50_s: float | None


@dataclass
class OversaturationDetector:
    """Fed finished records and the clock; says why the run is past saturation, or None."""

    rule: SaturationRule
    send_offsets_s: list[float]
    """Sorted scheduled send offsets (seconds from the start) of the whole open loop."""
    started_perf: float | None = None
    finished: int = 0
    _first_tokens: list[tuple[float, float]] = field(default_factory=list)
    _windows: list[_Window] = field(default_factory=list)

    def start(self) -> None:
        self.started_perf = time.perf_counter()

    def observe(self, record: RequestRecord, _text: str | None = None) -> None:
        self.finished += 1
        if record.ok and record.ttft_s is not None and record.first_token_at_s is not None:
            self._first_tokens.append((record.first_token_at_s, record.ttft_s))

    def close_window(self, now_perf: float | None = None, now_wall: float | None = None) -> str | None:
        """End a window; returns the reason the run is oversaturated, else None."""
        if self.started_perf is None:
            return None
        elapsed = (now_perf if now_perf is not None else time.perf_counter()) - self.started_perf
        sent = bisect.bisect_right(self.send_offsets_s, elapsed)
        wall = now_wall if now_wall is not None else time.time()
        recent = [ttft for at, ttft in self._first_tokens if at > wall - self.rule.window_s]
        self._first_tokens = [(at, ttft) for at, ttft in self._first_tokens if at > wall - self.rule.window_s]
        self._windows.append(_Window(sent - self.finished, float(np.median(recent)) if recent else None))
        return self.verdict()

    def verdict(self) -> str | None:
        rule = self.rule
        if len(self._windows) < rule.growing_windows + 1:
            return None
        streak = self._windows[-(rule.growing_windows + 1) :]
        first, last = streak[0], streak[-1]
        if not all(later.backlog > earlier.backlog for earlier, later in zip(streak, streak[1:])):
            return None
        if last.backlog < rule.min_backlog or last.backlog < rule.min_growth * max(first.backlog, 1):
            return None
        if last.ttft_p50_s is not None:
            if first.ttft_p50_s is None or last.ttft_p50_s < rule.ttft_growth * first.ttft_p50_s:
                return None
            ttft = f"TTFT p50 {first.ttft_p50_s * 1000:.0f} → {last.ttft_p50_s * 1000:.0f} ms"
        else:
            ttft = "no first token in the last window"
        span = rule.window_s * rule.growing_windows
        return (
            f"requests waiting grew {first.backlog} → {last.backlog} and {ttft} over the last {span:g} s: "
            "the server is past saturation"
        )


async def watch(detector: OversaturationDetector, interrupt: Interrupt, on_stop: Callable[[str], None]) -> None:
    """Close a window every `window_s`; when the rule fires stop sending, then cancel after the grace."""
    while True:
        await asyncio.sleep(detector.rule.window_s)
        reason = detector.close_window()
        if reason is None:
            continue
        on_stop(reason)
        interrupt.raise_to(STOP_SENDING)
        await asyncio.sleep(detector.rule.grace_s)
        interrupt.raise_to(STOP_NOW)
        return
