"""Interpolation in measured latency tables: linear in log space, extrapolation by the roofline.

Kernel latency grows roughly as a power of each shape dimension (tokens, sequence length,
batch, n, k) between regimes, so between two measured points the planner interpolates
log(latency) linearly in log(dimension). That is exact at table points and monotone between
them whenever the measured neighbours are. Outside the measured range the nearest measured
point is scaled by how the roofline time grows from it (the caller supplies that ratio), and
the lookup says it extrapolated, so `--explain` can label it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Bracket:
    """Where x falls on a sorted grid: the two neighbours and the weight of the upper one (log space)."""

    low: int
    high: int
    weight: float
    clamped_to: float | None
    """The grid point x was clamped to when outside the grid (None inside)."""


def bracket(grid: list[float], x: float) -> Bracket:
    """Neighbours of x on a sorted, positive grid; outside it, the end point (clamped_to set)."""
    if x <= grid[0]:
        return Bracket(0, 0, 0.0, grid[0] if x < grid[0] else None)
    if x >= grid[-1]:
        return Bracket(len(grid) - 1, len(grid) - 1, 0.0, grid[-1] if x > grid[-1] else None)
    high = bisect_left(grid, x)
    if grid[high] == x:
        return Bracket(high, high, 0.0, None)
    low = high - 1
    weight = (math.log(x) - math.log(grid[low])) / (math.log(grid[high]) - math.log(grid[low]))
    return Bracket(low, high, weight, None)


def interp_log(grid: list[float], values: list[float], x: float) -> tuple[float, float | None]:
    """Latency at x on a 1-D curve (log-log linear), and the grid point it was clamped to (or None)."""
    b = bracket(grid, x)
    if b.low == b.high:
        return values[b.low], b.clamped_to
    low, high = values[b.low], values[b.high]
    return math.exp(math.log(low) + b.weight * (math.log(high) - math.log(low))), None


def interp_curve(grid: list[float], values: list[float], x: float, grow: Callable[[float, float], float]) -> tuple[float, bool]:
    """Latency at x on one measured curve; beyond it, the end point times grow(end, x).

    Returns (latency, extrapolated).
    """
    value, clamped = interp_log(grid, values, x)
    if clamped is None:
        return value, False
    return value * grow(clamped, x), True


def blend_log(pairs: list[tuple[float, float]]) -> float:
    """exp(Σ wᵢ·log vᵢ / Σ wᵢ): the log-space weighted mean of (weight, value) pairs."""
    total = sum(weight for weight, _ in pairs)
    if total <= 0:
        return pairs[0][1]
    return math.exp(sum(weight * math.log(value) for weight, value in pairs) / total)
