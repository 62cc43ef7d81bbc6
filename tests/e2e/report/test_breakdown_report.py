"""The HTML report's "where TTFT goes" chart: one stacked bar per request type, drawn in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.browser import find_chromium, visit_page
from tests.unit.test_by_type import mixed_run, record
from vlmserve.report.html import render_html, write_html
from vlmserve.report.plots_breakdown import breakdown_charts
from vlmserve.results.metrics import summarize
from vlmserve.spec import SLO
from vlmserve.sweep.results import CellOutcome, DeploymentInfo, SweepResults

CHART = "chart-ttft-breakdown-0"


def results_with_types() -> SweepResults:
    load = {"dataset": "mixed", "mix": {"random": 0.5, "images": 0.5}, "concurrency": 2}
    cells = [
        CellOutcome("engine", "c2", load, "done", run_id="r2", summary=summarize(mixed_run(), None)),
        CellOutcome(
            "engine",
            "c4",
            {**load, "concurrency": 4},
            "done",
            run_id="r4",
            summary=summarize([record(index, "image", engine=None, repeat=False) for index in range(3)], None),
        ),
    ]
    info = DeploymentInfo(name="engine", kind="managed", devices=1.0, usd_per_gpu_hour=2.0, status="done")
    return SweepResults(name="types", deployments=[info], cells=cells, slo=SLO(), source="synthetic")


def test_one_bar_per_type_and_split_with_the_parts_stacked() -> None:
    [(label, element_id, figure)] = breakdown_charts(results_with_types())
    assert element_id == CHART and label == "mixed"
    names = [trace.name for trace in figure.data]
    assert names[:4] == ["upload", "frontend (HTTP, input and image processing)", "queue", "prefill (vision encoder included)"]
    assert names[4] == "after upload (no engine timings)"
    bars = list(figure.data[0].y)
    assert bars == [
        "2 users · text",
        "2 users · image",
        "2 users · image first",
        "2 users · image repeat",
        "4 users · image",
        "4 users · image first",
    ]
    prefill = dict(zip(bars, figure.data[3].x))
    assert prefill["2 users · image"] == pytest.approx(500.0) and prefill["4 users · image"] == 0.0
    assert figure.layout.barmode == "stack"


def test_no_breakdown_no_chart() -> None:
    results = results_with_types()
    for cell in results.cells:
        assert cell.summary is not None
        cell.summary.by_type = None
    assert breakdown_charts(results) == []
    assert CHART not in render_html(results, lambda cell: [])


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (scripts/ci-system-deps)")
def test_breakdown_chart_draws_in_chromium(tmp_path: Path, artifacts_dir: Path) -> None:
    report = write_html(results_with_types(), tmp_path / "report.html", lambda cell: [])
    visit = visit_page(
        report,
        ready_js=f"!!document.querySelector('#{CHART} svg.main-svg')",
        checks_js={
            "bars": f"document.querySelectorAll('#{CHART} .barlayer .trace').length",
            "title": f"(document.querySelector('#{CHART} .gtitle') || {{}}).textContent",
        },
        screenshot=artifacts_dir / "report-ttft-breakdown.png",
    )
    assert visit.console_errors == [], visit.console_errors
    assert visit.checks["bars"] == 5, visit.checks
    assert "Where TTFT goes, per request type" in visit.checks["title"]
