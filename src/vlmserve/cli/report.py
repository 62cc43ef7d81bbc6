"""`vlmserve report RUN_OR_SWEEP` and `vlmserve compare BASELINE CANDIDATE`."""

from __future__ import annotations

from pathlib import Path

import typer

from vlmserve.cli import consoles
from vlmserve.report.compare import DEFAULT_MIN_EFFECT, DEFAULT_THRESHOLD


def report_command(
    source: str = typer.Argument(..., metavar="RUN_OR_SWEEP", help="A stored run id, a sweep directory, or a sweep name."),
    html: Path | None = typer.Option(None, "--html", help="Write the self-contained HTML report to this file."),
    md: Path | None = typer.Option(None, "--md", help="Write the Markdown summary to this file."),
    cells: bool = typer.Option(False, "--cells", help="Also print every cell's numbers."),
) -> None:
    """Print a run's or a sweep's headline; write the HTML page (offline, no CDN) and a Markdown summary."""
    from vlmserve.report.console import print_report
    from vlmserve.report.html import write_html
    from vlmserve.report.markdown import write_markdown
    from vlmserve.report.source import load_source

    results = load_source(source)
    print_report(results, consoles.console(), cells=cells)
    if html is not None:
        typer.echo(f"HTML report: {write_html(results, html)}")
    if md is not None:
        typer.echo(f"markdown summary: {write_markdown(results, md)}")


def compare_command(
    baseline: str = typer.Argument(..., help="Baseline run id or sweep."),
    candidate: str = typer.Argument(..., help="Candidate run id or sweep."),
    threshold: float = typer.Option(
        DEFAULT_THRESHOLD, "--threshold", help="Single runs: a change worse than this fraction is a regression."
    ),
    min_effect: float = typer.Option(
        DEFAULT_MIN_EFFECT,
        "--min-effect",
        help="Repeated runs (--repeat N on both): a change counts when the 95% intervals "
        "are apart and the means differ by at least this fraction.",
    ),
    fail_on_regression: bool = typer.Option(False, "--fail-on-regression", help="Exit 1 when any regression is found (for CI)."),
    html: Path | None = typer.Option(None, "--html", help="Also write the comparison as a self-contained HTML page with plots."),
) -> None:
    """The same cells side by side: ratios ("TTFT p50 5.6× lower") and regressions beyond the noise threshold."""
    from vlmserve.report.compare import compare, print_comparison
    from vlmserve.report.source import load_source

    comparison = compare(load_source(baseline), load_source(candidate), threshold, min_effect)
    print_comparison(comparison, consoles.console())
    if html is not None:
        from vlmserve.report.compare_html import write_compare_html

        typer.echo(f"HTML comparison: {write_compare_html(comparison, html)}")
    if fail_on_regression and comparison.regressions():
        raise SystemExit(1)  # typer.Exit codes are swallowed under standalone_mode=False


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
    app.command("compare")(compare_command)
