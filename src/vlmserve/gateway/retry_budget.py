"""A retry budget: retries may add at most `ratio` of the request rate, plus a small floor.

Without one, a sick fleet turns every failure into several more requests and a brownout into
an outage (the pattern Finagle and Envoy budgets guard against).
"""

from __future__ import annotations

import time


class RetryBudget:
    def __init__(self, ratio: float = 0.2, min_per_s: float = 5.0, window_s: float = 10.0) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.capacity = max(1.0, (min_per_s + ratio * 100) * window_s)
        self.tokens = min_per_s * window_s
        self.updated_at = time.monotonic()

    def on_request(self) -> None:
        self.tokens = min(self.capacity, self.tokens + self.ratio)

    def try_spend(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated_at) * self.min_per_s)
        self.updated_at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
