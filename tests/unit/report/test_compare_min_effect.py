"""`compare` on repeated runs: a change counts when the 95 % intervals are apart AND it reaches --min-effect.

Two runs of one workload in two sessions can differ by a few percent with tight, separate intervals
(the machine was busier for one of them); that drift must read "within 5%", while a large shift
must still be a regression.
"""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers.synthetic import sweep_results
from vlmserve.bench.repeats import confidence_interval
from vlmserve.errors import UserError
from vlmserve.report.compare import COMPARED_METRICS, Comparison, compare, print_comparison
from vlmserve.results.blocks import RepeatsBlock
from vlmserve.sweep.results import SweepResults

JITTER = (-0.002, 0.0, 0.002)
"""Per-repeat spread around the mean: tight, so any shift of a percent or more separates the intervals."""


def repeated_run(latency_scale: float, jitter: tuple[float, ...] = JITTER) -> SweepResults:
    """One cell run with --repeat 3 whose latencies are `latency_scale` × a reference run's (throughput ÷ it)."""
    results = sweep_results([2], {"sim": 1.0})
    cell = results.cells[0]
    assert cell.summary is not None
    intervals = {}
    for metric in COMPARED_METRICS:
        value = cell.metric(metric.path)
        assert value is not None
        scaled = value * latency_scale if metric.lower_is_better else value / latency_scale
        intervals[metric.path] = confidence_interval([scaled * (1 + d) for d in jitter])
    cell.summary = cell.summary.model_copy(update={"repeats": RepeatsBlock(count=len(jitter), intervals=intervals)})
    return results


def verdicts(comparison: Comparison) -> dict[str, str]:
    [cell] = comparison.cells
    return {change.metric.label: change.verdict(comparison.threshold, comparison.min_effect) for change in cell.changes}


def printed(comparison: Comparison) -> str:
    console = Console(record=True, width=200)
    print_comparison(comparison, console)
    return console.export_text()


def test_a_small_significant_drift_is_within_the_minimum_effect() -> None:
    comparison = compare(repeated_run(1.0), repeated_run(1.03))
    [cell] = comparison.cells
    assert all(change.by_intervals and not change.intervals_overlap for change in cell.changes)
    assert set(verdicts(comparison).values()) == {"within 5%"}
    assert comparison.regressions() == []
    text = printed(comparison)
    assert "judged by 95% confidence intervals (3 vs 3 repeats), min effect 5%" in text
    assert "TTFT p50 3% higher" in text
    assert "no regression beyond the 95% confidence intervals and the 5% minimum effect" in text


def test_a_large_shift_still_regresses_and_its_mirror_improves() -> None:
    comparison = compare(repeated_run(1.0), repeated_run(1.3))
    assert set(verdicts(comparison).values()) == {"regressed"}
    regressions = comparison.regressions()
    assert len(regressions) == len(COMPARED_METRICS)
    assert any(
        line.startswith("c2: TTFT p50 30% higher (") and line.endswith("; 95% intervals apart, at least 5%)")
        for line in regressions
    ), regressions
    text = printed(comparison)
    assert "REGRESSION" in text and f"{len(COMPARED_METRICS)} regression(s) beyond the 95% confidence" in text
    assert set(verdicts(compare(repeated_run(1.3), repeated_run(1.0))).values()) == {"improved"}


def test_overlapping_intervals_are_unchanged_however_large_the_means_differ() -> None:
    wide = (-0.4, 0.0, 0.4)  # repeats scattered ±40 %: the intervals cover a 20 % shift
    comparison = compare(repeated_run(1.0, wide), repeated_run(1.2, wide))
    assert set(verdicts(comparison).values()) == {"unchanged"}
    assert comparison.regressions() == []


def test_the_minimum_effect_is_a_flag() -> None:
    # 0 restores the bare interval test: a 3 % drift with separate intervals is a regression
    strict = compare(repeated_run(1.0), repeated_run(1.03), min_effect=0.0)
    assert set(verdicts(strict).values()) == {"regressed"}
    # a demanding user may also raise it: 30 % below a 50 % floor is not a regression
    lenient = compare(repeated_run(1.0), repeated_run(1.3), min_effect=0.5)
    assert lenient.regressions() == [] and set(verdicts(lenient).values()) == {"within 50%"}
    with pytest.raises(UserError, match=r"^--min-effect must be zero or positive, e\.g\. 0\.05 for 5%$"):
        compare(repeated_run(1.0), repeated_run(1.0), min_effect=-0.1)


def test_single_runs_ignore_the_minimum_effect() -> None:
    baseline, candidate = sweep_results([2], {"sim": 1.0}), sweep_results([2], {"sim": 1.12})
    comparison = compare(baseline, candidate, min_effect=0.5)  # 12 % beyond the 10 % threshold: a regression
    assert "regressed" in verdicts(comparison).values()
    assert "single runs: judged by the 10% noise threshold" in printed(comparison)
    assert "within noise" in verdicts(compare(baseline, sweep_results([2], {"sim": 1.03}))).values()
