"""Knee detection, best operating point and ranking on runs summarised by the bench's metrics."""

from __future__ import annotations

from tests.helpers.synthetic import sweep_results
from vlmserve.spec import SLO
from vlmserve.sweep.knee import LoadPoint, find_knee, find_knees, no_knee_reason
from vlmserve.sweep.rank import best_operating_point, cheapest, rank_deployments, slo_misses


def test_knee_matches_the_issue_example() -> None:
    # 20% more users bought 4% more requests/s and 34% more p95 TTFT -> the knee is the lower level
    points = [
        LoadPoint(150, 10.0, 200, "u150"),
        LoadPoint(200, 13.0, 260, "u200"),
        LoadPoint(250, 15.0, 320, "u250"),
        LoadPoint(300, 15.6, 429, "u300"),
        LoadPoint(360, 15.8, 700, "u360"),
    ]
    knee = find_knee(points, min_gain_fraction=0.5)
    assert knee is not None and knee[0].cell == "u250" and knee[1].cell == "u300"


def test_no_knee_while_throughput_scales() -> None:
    points = [LoadPoint(1, 1.0, 50, "a"), LoadPoint(2, 1.9, 52, "b"), LoadPoint(4, 3.7, 55, "c")]
    assert find_knee(points, 0.5) is None


def test_knees_and_best_point_on_a_saturating_server() -> None:
    results = sweep_results([1, 2, 4, 8, 16, 32], {"fast": 1.0, "slow": 2.0}, slo=SLO.parse("ttft_p95=300ms"))
    knees = {knee.deployment: knee for knee in find_knees(results)}
    assert knees["fast"].knee_level == 8 and knees["slow"].knee_level == 8
    assert "bought" in knees["fast"].sentence()
    best, note = best_operating_point(results.cells_of("slow"), results.slo)
    assert best is not None and best.cell == "c8" and note == ""
    too_slow = [cell for cell in results.cells_of("slow") if cell.cell == "c32"][0]
    assert slo_misses(too_slow, results.slo) and slo_misses(too_slow, results.slo)[0].startswith("ttft_p95")


def test_ranking_by_goodput_per_device_and_cost() -> None:
    results = sweep_results([1, 4, 8], {"slow": 2.0, "fast": 1.0})
    ranked = rank_deployments(results)
    assert [choice.deployment for choice in ranked] == ["fast", "slow"]
    assert ranked[0].goodput_per_device and ranked[0].goodput_per_device > ranked[1].goodput_per_device  # type: ignore[operator]
    cheap = cheapest(ranked)
    assert cheap is not None and cheap.deployment == "fast"
    # two devices at the same speed halve the per-device figure and double the cost per token
    results.deployment("fast").devices = 2.0
    ranked = rank_deployments(results)
    fast = next(choice for choice in ranked if choice.deployment == "fast")
    assert fast.usd_per_million_output_tokens is not None
    assert abs(fast.usd_per_million_output_tokens - 2 * cheap.usd_per_million_output_tokens) < 1e-6  # type: ignore[operator]


def test_no_cell_meeting_slo_is_said() -> None:
    results = sweep_results([16, 32], {"slow": 2.0}, slo=SLO.parse("ttft_p95=10ms"))
    best, note = best_operating_point(results.cells, results.slo)
    assert best is None and note == "no cell met every SLO"
    assert rank_deployments(results)[0].note == "no cell met every SLO"


def test_best_point_is_chosen_within_one_workload_shape() -> None:
    # the long-prompt cells are the sweep's main shape; a lone short-prompt cell serves far
    # more requests/s but is other work: it must not become the best operating point
    results = sweep_results([1, 2, 4], {"fast": 1.0})
    for cell in results.cells:
        cell.load = {**cell.load, "input_len": 2048}
    short = sweep_results([32], {"fast": 1.0}).cells[0]
    short.cell = "short-c32"
    results.cells.append(short)
    best, note = best_operating_point(results.cells, results.slo)
    assert best is not None and best.cell != "short-c32" and best.load["input_len"] == 2048
    choice = rank_deployments(results)[0]
    assert choice.best_cell == best.cell and choice.workload == "random 2048→32"


def test_slo_misses_read_as_words() -> None:
    results = sweep_results([32], {"slow": 2.0}, slo=SLO.parse("ttft_p95=10ms"))
    miss = slo_misses(results.cells[0], results.slo)[0]
    assert miss.startswith("ttft_p95 ") and miss.endswith(" ms > 10 ms: missed")


def test_a_run_with_one_load_level_says_it_cannot_show_a_knee() -> None:
    """One level per deployment is not "throughput still scaled": there is nothing to compare."""
    one_level = sweep_results([8], {"fast": 1.0, "slow": 2.0})
    assert find_knees(one_level) == []
    assert no_knee_reason(one_level).startswith("no knee to look for: each deployment has at most one measured load level")
    scaling = sweep_results([1, 2], {"fast": 1.0})
    assert find_knees(scaling) == []
    assert no_knee_reason(scaling) == "no knee found: throughput still scaled at the highest load measured"
