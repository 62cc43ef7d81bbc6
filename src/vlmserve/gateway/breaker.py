"""A circuit breaker per replica: passive ejection after repeated failures, re-admission on probation.

closed ──(N consecutive failures)──► open ──(open time passes)──► half-open (one probe at a time)
   ▲                                   ▲                              │
   └──────────── probe succeeds ───────┼──────────────────────────────┤
                                       └──── probe fails (open time doubles, up to a cap) ◄┘

The pool may forbid opening (`may_open=False`) when its ejection cap is reached: the breaker then
stays closed and keeps counting, and opens on a later failure once opening is allowed again.
"""

from __future__ import annotations

from enum import Enum


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Tracks one replica's recent outcomes; the clock is passed in so tests need no sleeping."""

    def __init__(self, failures_to_open: int = 3, open_s: float = 5.0, open_max_s: float = 60.0) -> None:
        self.failures_to_open = failures_to_open
        self.base_open_s = open_s
        self.open_max_s = open_max_s
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.current_open_s = open_s
        self.reopen_at = 0.0
        self.probes_in_flight = 0

    def available(self, now: float) -> bool:
        """Whether a new request may be sent now (pure: does not change state)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return now >= self.reopen_at
        return self.probes_in_flight == 0

    def on_dispatch(self, now: float) -> None:
        """A request is being sent; after the open period the first one becomes the probe."""
        if self.state is BreakerState.OPEN and now >= self.reopen_at:
            self.state = BreakerState.HALF_OPEN
            self.probes_in_flight = 0
        if self.state is BreakerState.HALF_OPEN:
            self.probes_in_flight += 1

    def record_success(self) -> None:
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.current_open_s = self.base_open_s
        self.probes_in_flight = 0

    def record_failure(self, now: float, may_open: bool = True) -> bool:
        """Count a failure; returns True when this failure ejected the replica."""
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self.current_open_s = min(self.current_open_s * 2, self.open_max_s)
            self._open(now)
            return True
        if self.state is BreakerState.CLOSED and self.consecutive_failures >= self.failures_to_open and may_open:
            self._open(now)
            return True
        return False

    def record_abandoned(self) -> None:
        """No verdict on this attempt (the client left, or the failure may be the request's own):
        a probe slot is freed, nothing else."""
        if self.state is BreakerState.HALF_OPEN and self.probes_in_flight > 0:
            self.probes_in_flight -= 1

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self.reopen_at = now + self.current_open_s
        self.probes_in_flight = 0
