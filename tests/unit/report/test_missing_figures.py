"""A run with missing figures (an imported file that lacks them) is reported and compared with the
missing ones as unknown: no traceback, no 'X → None' difference burying the one that matters."""

from __future__ import annotations

from vlmserve.report.charts import all_charts, pareto_chart
from vlmserve.report.compare import compare, load_differences, load_unknown
from vlmserve.results.summary import RunSummary
from vlmserve.spec import SLO
from vlmserve.sweep.results import CellOutcome, DeploymentInfo, SweepResults


def one_run(name: str, load: dict, figures: dict) -> SweepResults:
    """A one-cell SweepResults as `report` builds from a stored run."""
    summary = RunSummary.from_partial({"requests": {"total": 10, "completed": 10, "failed": 0}, **figures})
    cell = CellOutcome(deployment="endpoint", cell=name, load=load, status="done", run_id=name, summary=summary)
    info = DeploymentInfo(
        name="endpoint", kind="endpoint", devices=1.0, spec=None, endpoint=None, model="m", status="done", server_version=None
    )
    return SweepResults(name=name, deployments=[info], cells=[cell], slo=SLO(bounds_s={}), source=name)


FULL = {
    "ttft_ms": {"p50": 30.0, "p95": 40.0, "p99": 45.0},
    "tpot_ms": {"p50": 8.0},
    "throughput": {"output_tokens_per_s": 300.0, "requests_per_s": 40.0},
}
NO_TTFT_TAIL = {
    "ttft_ms": {"p50": 36.0},
    "tpot_ms": {"p50": 8.2},
    "throughput": {"output_tokens_per_s": 290.0, "requests_per_s": 36.0},
}


def test_a_run_without_a_load_level_draws_every_chart() -> None:
    """The AIPerf traceback: the Pareto hover text formatted a None load level with ':g'."""
    results = one_run("imported", {}, FULL)
    assert results.cells[0].load_level is None
    texts = [trace.text for trace in pareto_chart(results).data if trace.name == "endpoint"]
    assert texts == [("imported (load unknown)",)]
    assert [element for element, _ in all_charts(results)] == ["chart-throughput", "chart-ttft", "chart-tpot", "chart-pareto"]


def test_compare_lists_figures_one_side_lacks_as_unknown_not_as_changes() -> None:
    comparison = compare(one_run("base", {"concurrency": 4}, FULL), one_run("cand", {"concurrency": 4}, NO_TTFT_TAIL))
    (cell,) = comparison.cells
    assert [change.metric.label for change in cell.changes] == ["TTFT p50", "TPOT p50", "throughput", "requests/s"]
    assert cell.unknown == ["TTFT p95 (unknown in candidate)", "TTFT p99 (unknown in candidate)"]
    assert all("None" not in line for line in comparison.regressions() + comparison.headlines())


def test_load_settings_one_side_lacks_are_unknown_and_the_real_difference_comes_first() -> None:
    ours = {
        "api": "chat",
        "dataset": "random",
        "input_len": 32,
        "output_len": 8,
        "concurrency": 4,
        "arrival": "poisson",
        "burstiness": 1.0,
        "image_size": [64, 64],
        "ignore_eos": True,
        "seed": 1,
    }
    theirs = {"api": "completions", "rate": 12.0}
    assert load_differences(ours, theirs) == ["closed loop, concurrency 4 → open loop, rate 12.0", "api chat → completions"]
    assert load_unknown(ours, theirs) == [
        "dataset (unknown in candidate)",
        "input_len (unknown in candidate)",
        "output_len (unknown in candidate)",
        "4 other load setting(s) recorded on one side only",
    ]
    assert load_differences({"concurrency": 4}, {"concurrency": 8}) == ["concurrency 4 → 8"]
    assert load_unknown({"concurrency": 4}, {}) == ["concurrency (unknown in candidate)"]
