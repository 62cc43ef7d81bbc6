"""`vlmserve compare --html OUT`: the comparison page with plots of both runs, opened in headless Chromium."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.browser import check_report_in_browser, find_chromium
from tests.helpers.synthetic import saturating_records
from vlmserve.report.compare import compare
from vlmserve.report.compare_html import render_compare_html
from vlmserve.report.plots_common import SIMULATED_TITLE_MARK
from vlmserve.report.source import load_source
from vlmserve.results.metrics import summarize
from vlmserve.results.run import RunResult

COMPARE_CHART_IDS = ("chart-compare-latency-throughput", "chart-compare-cdf-0", "chart-compare-timeline-0")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stored_run(label: str, slowdown: float, simulated: bool = False) -> str:
    from vlmserve.results import store

    records = saturating_records(4, slowdown=slowdown)
    summary = summarize(records, None)
    summary.meta = {
        "label": label,
        "target": "http://127.0.0.1:1",
        "model": "m",
        "simulated": simulated,
        "load_spec": {"dataset": "random", "input_len": 128, "output_len": 32, "concurrency": 4},
    }
    return store.save_run(RunResult(records=records, summary=summary))


def test_page_shows_verdicts_tables_and_both_runs_plots(home: Path) -> None:
    baseline, slower = stored_run("baseline", 1.0), stored_run("regressed", 1.3)
    page = render_compare_html(compare(load_source(baseline), load_source(slower)))
    assert page.count("<script") == 1 + 3, "plotly.js once, then one script per plot"
    assert "regression(s) beyond the 10% noise threshold" in page and "TTFT p50 30% higher" in page
    for chart in COMPARE_CHART_IDS:
        assert f'id="{chart}"' in page
    assert '"name":"baseline"' in page and '"name":"candidate"' in page
    assert SIMULATED_TITLE_MARK not in page and "simulated." not in page


def test_a_simulated_side_is_named_in_banner_and_titles(home: Path) -> None:
    page = render_compare_html(
        compare(load_source(stored_run("measured", 1.0)), load_source(stored_run("planned", 1.0, simulated=True)))
    )
    assert "<b>candidate simulated.</b>" in page
    assert page.count(SIMULATED_TITLE_MARK) == 3


def test_missing_records_leave_a_note_not_an_error(home: Path) -> None:
    from vlmserve.results import store

    baseline, candidate = stored_run("baseline", 1.0), stored_run("candidate", 1.0)
    (store.records_dir() / f"{baseline}.parquet").unlink()
    page = render_compare_html(compare(load_source(baseline), load_source(candidate)))
    assert "per-request records not stored for one side" in page
    assert 'id="chart-compare-cdf-0"' in page, "the side with records is still drawn"


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (scripts/ci-system-deps)")
def test_compare_html_from_the_cli_renders_in_chromium(
    home: Path, vlmserve_cmd: list[str], tmp_path: Path, artifacts_dir: Path
) -> None:
    baseline, candidate = stored_run("baseline", 1.0), stored_run("candidate", 1.3, simulated=True)
    out = tmp_path / "compare.html"
    env = {**os.environ, "VLMSERVE_HOME": str(home), "COLUMNS": "200"}
    done = subprocess.run(
        [*vlmserve_cmd, "compare", baseline, candidate, "--html", str(out)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert f"HTML comparison: {out}" in done.stdout
    checks = check_report_in_browser(
        out, artifacts_dir / "compare.png", chart_ids=COMPARE_CHART_IDS, title_mark=SIMULATED_TITLE_MARK.strip()
    )
    assert checks["chart-compare-cdf-0"] == 2 * 3, "baseline and candidate in each of TTFT, TPOT, E2E"
