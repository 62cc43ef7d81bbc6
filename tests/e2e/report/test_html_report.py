"""The HTML report in a real headless Chromium: loads offline, no console errors, every chart drawn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.browser import CHART_IDS, check_report_in_browser, find_chromium
from tests.helpers.synthetic import saturating_records, sweep_results, sweep_with_records
from vlmserve.report.html import render_html, write_html
from vlmserve.report.markdown import render_markdown
from vlmserve.report.plots_cdf import MAX_POINTS, cdf_points
from vlmserve.report.plots_common import SIMULATED_TITLE_MARK
from vlmserve.report.plots_timeline import timeline
from vlmserve.results import store
from vlmserve.results.records import RequestRecord
from vlmserve.spec import SLO
from vlmserve.sweep.results import CellOutcome, SweepResults

SHAPE_CHART_IDS = ("chart-latency-throughput-0", "chart-cdf-0", "chart-timeline-0")

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (scripts/ci-system-deps)")


def synthetic() -> SweepResults:
    return sweep_results(
        [1, 2, 4, 8, 16, 32],
        {"one-replica": 1.0, "slow-replica": 2.0},
        slo=SLO.parse("ttft_p95=300ms"),
        failed_cell=("one-replica", "c32"),
    )


def synthetic_with_records() -> tuple[SweepResults, dict[str, list[RequestRecord]]]:
    return sweep_with_records(
        [1, 2, 4, 8, 16, 32],
        {"one-replica": 1.0, "slow-replica": 2.0},
        slo=SLO.parse("ttft_p95=300ms"),
        failed_cell=("one-replica", "c32"),
    )


def loader(by_run: dict[str, list[RequestRecord]]):
    return lambda cell: by_run.get(cell.run_id or "", [])


def test_report_is_self_contained_and_marks_failures(tmp_path: Path) -> None:
    results, by_run = synthetic_with_records()
    report = write_html(results, tmp_path / "report.html", loader(by_run))
    page = report.read_text()
    assert page.count("<script") == 1 + 4 + 3, "plotly.js once, then one small script per chart"
    assert not re.search(r"<script[^>]+src=", page) and "cdn" not in page.lower().split("</script>", 1)[1]
    assert "11 of 12 cells succeeded" in page
    assert "the c32 cell on one-replica failed: all 64 requests failed" in page
    assert "knee at concurrency 8" in page


def test_markdown_summary_has_headline_and_failures() -> None:
    text = render_markdown(synthetic())
    assert text.startswith("## vlmserve report: synthetic")
    assert "| rank | deployment |" in text
    assert "✗ one-replica | c32" in text
    assert "knee at concurrency 8 (c8)" in text


@needs_chromium
def test_html_report_renders_in_chromium(tmp_path: Path, artifacts_dir: Path) -> None:
    results, by_run = synthetic_with_records()
    report = write_html(results, tmp_path / "report.html", loader(by_run))
    checks = check_report_in_browser(
        report,
        artifacts_dir / "report-synthetic.png",
        chart_ids=CHART_IDS + SHAPE_CHART_IDS,
        title_mark=SIMULATED_TITLE_MARK.strip(),
    )
    assert checks["chart-cdf-0"] >= 3 * 11, "a TTFT, TPOT and E2E curve for each of the 11 finished cells"
    assert checks["chart-latency-throughput-0"] >= 2 * 2 * 2, "p50 and p95, TTFT and TPOT, per deployment"


def test_per_shape_plots_come_from_the_history_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the CDF and timeline read each cell's Parquet records from the run history."""
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))
    results, by_run = synthetic_with_records()
    stored = "run-one-replica-4"
    store.write_records_parquet(by_run[stored], store.records_dir() / f"{stored}.parquet")
    page = render_html(results)
    assert 'id="chart-latency-throughput-0"' in page and 'id="chart-cdf-0"' in page
    assert page.count('"name":"one-replica \\u00b7 4 users"') == 3 + 3, "3 CDF and 3 timeline panels"
    assert '"name":"one-replica \\u00b7 8 users"' not in page, "only the stored run has curves from records"
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "empty"))
    page = render_html(results)
    assert 'id="chart-latency-throughput-0"' in page, "summary-only plots need no records"
    assert 'id="chart-cdf-0"' not in page and 'id="chart-timeline-0"' not in page


def test_one_figure_set_per_workload_shape() -> None:
    results, by_run = synthetic_with_records()
    long_prompts = [
        CellOutcome(
            cell.deployment,
            cell.cell + "-long",
            {**cell.load, "input_len": 2048},
            cell.status,
            run_id=cell.run_id,
            summary=cell.summary,
        )
        for cell in results.cells
        if cell.ok
    ]
    results.cells.extend(long_prompts)
    page = render_html(results, loader(by_run))
    for index in (0, 1):
        for kind in ("latency-throughput", "cdf", "timeline"):
            assert f'id="chart-{kind}-{index}"' in page
    assert "<h3>random 128→32</h3>" in page and "<h3>random 2048→32</h3>" in page


def test_simulated_runs_say_so_in_every_plot_title() -> None:
    results, by_run = synthetic_with_records()
    assert results.simulated()
    page = render_html(results, loader(by_run))
    assert page.count(SIMULATED_TITLE_MARK) >= 4 + 3
    for info in results.deployments:
        info.spec = {"name": info.name, "engine": "vllm"}
    page = render_html(results, loader(by_run))
    assert SIMULATED_TITLE_MARK not in page


def test_cdf_is_monotone_and_thinned() -> None:
    x, y = cdf_points([0.003, 0.001, 0.002])
    assert x == pytest.approx([1.0, 2.0, 3.0]) and y == pytest.approx([1 / 3, 2 / 3, 1.0])
    x, y = cdf_points([index / 1000 for index in range(10_000)])
    assert len(x) <= MAX_POINTS and y[-1] == 1.0 and x == sorted(x)


def test_timeline_buckets_by_second() -> None:
    records = saturating_records(4, requests=64)  # waves of 4 users, 0.36 s per request
    line = timeline(records)
    span = max(record.finished_at_s or 0 for record in records) - min(record.sent_at_s for record in records)
    assert len(line.start_s) == int(span) + 1 and line.start_s[:2] == [0.0, 1.0]
    assert sum(line.output_tokens_per_s) == sum(record.output_tokens or 0 for record in records)
    assert line.ttft_p50_ms[0] == pytest.approx(50.0) and line.tpot_p50_ms[1] == pytest.approx(10.0)


def test_short_runs_get_finer_timeline_buckets() -> None:
    from vlmserve.report.plots_timeline import bucket_size_s

    long_run = saturating_records(1, requests=64)  # about 23 s
    short_run = saturating_records(32, requests=64)[:8]  # about 2 s
    assert bucket_size_s([long_run, short_run]) == 1.0
    assert bucket_size_s([short_run]) == 0.2, "at least 10 buckets"
    assert bucket_size_s([]) == 0.01
