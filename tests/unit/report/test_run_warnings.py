"""A run's warnings (e.g. a prefix-cache hit rate above what the workload intends) reach every report form."""

from __future__ import annotations

from rich.console import Console

from tests.helpers.synthetic import sweep_results
from vlmserve.report.console import print_report
from vlmserve.report.html import render_html
from vlmserve.report.markdown import render_markdown

WARNING = "prefix-cache hit rate 73% is above the 0% this workload intends (fresh prompts)"


def test_cell_warnings_are_in_console_markdown_and_html() -> None:
    results = sweep_results([1, 4], {"fast": 1.0})
    results.cells[1].summary = results.cells[1].summary.model_copy(update={"warnings": [WARNING]})
    console = Console(record=True, width=400)
    print_report(results, console)
    assert f"fast/c4: {WARNING}" in console.export_text()
    assert f"fast/c4: {WARNING}" in render_markdown(results)
    assert "fast/c4: prefix-cache hit rate 73% is above" in render_html(results)
