"""How late each streamed chunk left the server compared with when the model scheduled it.

The sim engine promises that a token leaves at the end of the step that produced it.
Python overhead, timer granularity and a busy loop make the real emission late; this
recorder keeps that error (actual − scheduled) for every chunk in a fixed-resolution
histogram (10 µs bins), cheap enough to run always, and served at /debug/timing.
"""

from __future__ import annotations

import bisect
import itertools

from vlmserve.json_types import JSONObject

_BIN_S = 10e-6
_LOW_S = -0.005
_NUM_BINS = int((0.200 - _LOW_S) / _BIN_S)


class EmissionTimingRecorder:
    """Distribution of (actual − scheduled) emission times, in 10 µs bins from −5 ms to +200 ms."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * (_NUM_BINS + 1)
        self.count = 0
        self.total_s = 0.0
        self.min_s = float("inf")
        self.max_s = float("-inf")

    def record(self, error_s: float, chunks: int = 1) -> None:
        index = int((error_s - _LOW_S) / _BIN_S)
        if index < 0:
            index = 0
        elif index > _NUM_BINS:
            index = _NUM_BINS
        self.counts[index] += chunks
        self.count += chunks
        self.total_s += error_s * chunks
        if error_s < self.min_s:
            self.min_s = error_s
        if error_s > self.max_s:
            self.max_s = error_s

    def quantile_s(self, q: float, cumulative: list[int] | None = None) -> float | None:
        """Upper edge of the bin holding quantile q (never understates lateness)."""
        if self.count == 0:
            return None
        cumulative = cumulative if cumulative is not None else list(itertools.accumulate(self.counts))
        index = bisect.bisect_left(cumulative, max(1.0, q * self.count))
        return min(_LOW_S + (index + 1) * _BIN_S, self.max_s + _BIN_S)

    def summary(self) -> JSONObject:
        """Milliseconds; percentiles are bin upper edges (10 µs resolution)."""

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000.0, 3)

        cumulative = list(itertools.accumulate(self.counts))

        def quantile_ms(q: float) -> float | None:
            return ms(self.quantile_s(q, cumulative))

        return {
            "chunks": self.count,
            "mean_ms": ms(self.total_s / self.count) if self.count else None,
            "min_ms": ms(self.min_s) if self.count else None,
            "p50_ms": quantile_ms(0.50),
            "p90_ms": quantile_ms(0.90),
            "p99_ms": quantile_ms(0.99),
            "p999_ms": quantile_ms(0.999),
            "max_ms": ms(self.max_s) if self.count else None,
        }
