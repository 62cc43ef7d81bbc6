"""The HTML report in a real headless Chromium: loads offline, no console errors, every chart drawn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.report.browser import check_report_in_browser, find_chromium
from tests.report.synthetic import sweep_results
from vlmserve.report.html import write_html
from vlmserve.report.markdown import render_markdown
from vlmserve.spec import SLO
from vlmserve.sweep.results import SweepResults

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (scripts/ci-system-deps)")


def synthetic() -> SweepResults:
    return sweep_results([1, 2, 4, 8, 16, 32], {"one-replica": 1.0, "slow-replica": 2.0},
                         slo=SLO.parse("ttft_p95=300ms"), failed_cell=("one-replica", "c32"))


def test_report_is_self_contained_and_marks_failures(tmp_path: Path) -> None:
    report = write_html(synthetic(), tmp_path / "report.html")
    page = report.read_text()
    assert page.count("<script") == 1 + 4, "plotly.js once, then one small script per chart"
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
    report = write_html(synthetic(), tmp_path / "report.html")
    check_report_in_browser(report, artifacts_dir / "report-synthetic.png")
