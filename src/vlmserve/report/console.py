"""The terminal view of a report: the outcome line, the headline table and the findings."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table as RichTable

from vlmserve.report.tables import Table, cell_table, headline_table, knee_sentences
from vlmserve.sweep.knee import no_knee_reason
from vlmserve.sweep.rank import cheapest, rank_deployments
from vlmserve.sweep.results import SIMULATED_NOTE, SweepResults

_ROW_STYLE = {"failed": "red", "limited": "yellow", "best": "green", "": ""}
HEADLINE_COLUMNS = [
    "rank",
    "deployment",
    "devices",
    "cells ok",
    "best point",
    "goodput/dev",
    "tok/s/dev",
    "TTFT p95 ms",
    "TPOT p50 ms",
    "$ / 1M out tok",
]
CELL_COLUMNS = [
    "deployment",
    "cell",
    "load",
    "status",
    "req/s",
    "out tok/s",
    "TTFT p50",
    "TTFT p95",
    "TPOT p50",
    "run id / reason",
]


def rich_table(table: Table) -> RichTable:
    view = RichTable(title=table.title, title_justify="left", show_lines=False)
    for column in table.columns:
        view.add_column(column, overflow="fold")
    for row, flag in zip(table.rows, table.flags):
        view.add_row(*row, style=_ROW_STYLE.get(flag, ""))
    return view


def print_report(results: SweepResults, console: Console, *, cells: bool = False) -> None:
    """Print the headline (and every cell when asked) to the terminal."""
    choices = rank_deployments(results)
    done, total = results.counts()
    console.print(f"[bold]{results.name}[/]: " + results.outcome_line(), style="green" if done == total else "yellow")
    for note in results.all_notes():
        console.print(f"[yellow]⚠ {note}[/]")
    if results.simulated():
        console.print(f"[dim]{SIMULATED_NOTE}[/]")
    console.print(rich_table(headline_table(results, choices).select(HEADLINE_COLUMNS)))
    for sentence in knee_sentences(results) or [no_knee_reason(results)]:
        console.print(f"• {sentence}")
    cheap = cheapest(choices)
    if cheap is not None:
        console.print(
            f"• cheapest per token: {cheap.deployment} at ${cheap.usd_per_million_output_tokens:.2f} per million output tokens"
        )
    if cells:
        console.print(rich_table(cell_table(results).select(CELL_COLUMNS)))
