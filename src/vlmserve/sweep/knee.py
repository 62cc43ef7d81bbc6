"""Saturation: the load level past which more load buys queueing instead of throughput.

Walking a series (one deployment, one workload shape, rising concurrency or rate), the
knee is the last level before the first step whose throughput grows by less than
`min_gain_fraction` of the load's growth while p95 TTFT grows faster than throughput.
Growth is compared in log terms (the step's throughput elasticity, ln(thr_b/thr_a) /
ln(load_b/load_a)), so a 4× step and a 1.2× step are judged alike: 20% more users buying
4% more requests/s is an elasticity of 0.2; 4× the users buying 2.2× the requests/s is 0.57.
Example: 20% more users bought 4% more requests/s and 34% more p95 TTFT → knee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vlmserve.sweep.results import CellOutcome, SweepResults

THROUGHPUT_METRIC = "throughput.requests_per_s"
TAIL_METRIC = "ttft_ms.p95"


@dataclass(frozen=True)
class LoadPoint:
    """One measured load level of a series."""

    level: float
    throughput: float
    ttft_p95_ms: float
    cell: str


@dataclass(frozen=True)
class Knee:
    """Where a series saturates and the step that shows it."""

    deployment: str
    series: str
    level_name: str
    knee_level: float
    knee_cell: str
    next_level: float
    load_gain: float
    throughput_gain: float
    ttft_p95_growth: float

    def sentence(self) -> str:
        """The finding in words, with the step's relative changes."""
        return (
            f"{self.deployment}: knee at {self.level_name} {self.knee_level:g} ({self.knee_cell}); going to "
            f"{self.next_level:g} (+{self.load_gain:.0%} load) bought {self.throughput_gain:+.0%} requests/s "
            f"and {self.ttft_p95_growth:+.0%} p95 TTFT"
        )


def throughput_elasticity(before: LoadPoint, after: LoadPoint) -> float:
    """ln(throughput ratio) / ln(load ratio): 1 = scales with load, 0 = flat, < 0 = falls."""
    if after.throughput <= 0:
        return float("-inf")
    return math.log(after.throughput / before.throughput) / math.log(after.level / before.level)


def find_knee(points: list[LoadPoint], min_gain_fraction: float) -> tuple[LoadPoint, LoadPoint] | None:
    """First step (a → b) with throughput elasticity < min_gain_fraction while p95 TTFT grows faster.

    Returns (knee point, the point after it) or None when throughput still scales at the top level.
    """
    ordered = sorted(points, key=lambda point: point.level)
    for before, after in zip(ordered, ordered[1:]):
        if before.level <= 0 or after.level <= before.level or before.throughput <= 0 or before.ttft_p95_ms <= 0:
            continue
        throughput_gain = after.throughput / before.throughput - 1.0
        ttft_growth = after.ttft_p95_ms / before.ttft_p95_ms - 1.0
        if throughput_elasticity(before, after) < min_gain_fraction and ttft_growth > throughput_gain:
            return before, after
    return None


def series_points(cells: list[CellOutcome]) -> dict[str, list[LoadPoint]]:
    """Group successful cells into series keyed by deployment + workload shape."""
    grouped: dict[str, list[LoadPoint]] = {}
    for cell in cells:
        level = cell.load_level
        throughput = cell.metric(THROUGHPUT_METRIC)
        tail = cell.metric(TAIL_METRIC)
        if not cell.ok or level is None or throughput is None or tail is None:
            continue
        grouped.setdefault(cell.series_key, []).append(LoadPoint(level, throughput, tail, cell.cell))
    return grouped


def no_knee_reason(results: SweepResults) -> str:
    """What to tell a reader when `find_knees` found none: a single load level cannot show a knee
    at all, which is not the same finding as throughput still scaling."""
    points = series_points(results.cells).values()
    if not any(len(series) >= 2 for series in points):
        return (
            "no knee to look for: each deployment has at most one measured load level; "
            "a knee needs two or more (add load levels to the sweep)"
        )
    return "no knee found: throughput still scaled at the highest load measured"


def find_knees(results: SweepResults) -> list[Knee]:
    """Every series' knee, in deployment order; series without one are left out."""
    knees: list[Knee] = []
    by_key = {cell.series_key: cell for cell in results.cells}
    for key, points in series_points(results.cells).items():
        if len(points) < 2:
            continue
        found = find_knee(points, results.knee_min_gain_fraction)
        if found is None:
            continue
        before, after = found
        sample = by_key[key]
        knees.append(
            Knee(
                deployment=sample.deployment,
                series=key,
                level_name=sample.load_level_name,
                knee_level=before.level,
                knee_cell=before.cell,
                next_level=after.level,
                load_gain=after.level / before.level - 1.0,
                throughput_gain=after.throughput / before.throughput - 1.0,
                ttft_p95_growth=after.ttft_p95_ms / before.ttft_p95_ms - 1.0,
            )
        )
    return knees
