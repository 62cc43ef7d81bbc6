"""What every report plot shares: the palette, the page layout, workload-shape groups, the simulated mark.

Figures compare only within one workload shape (128-token prompts always beat 2048-token
ones), so the per-shape plots group cells here once; and a figure drawn from simulated
runs says so in its own title, because a plot is often copied out of the page without
the banner above it.
"""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go

from vlmserve.report.run_records import RecordsLoader
from vlmserve.report.tables import level_label
from vlmserve.results.records import RequestRecord
from vlmserve.sweep.results import CellOutcome, SweepResults

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]

SIMULATED_TITLE_MARK = " (simulated)"
"""Appended to the title of every figure drawn from simulated runs."""


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def style(figure: go.Figure, title: str, height: int = 420) -> go.Figure:
    """The report's common look: white template, compact margins, small legend."""
    figure.update_layout(
        title=title,
        template="plotly_white",
        height=height,
        hovermode="closest",
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"font": {"size": 11}},
    )
    return figure


def mark_simulated(figure: go.Figure) -> go.Figure:
    """Add the simulated mark to the figure's title (once)."""
    title = figure.layout.title.text or ""
    if not title.endswith(SIMULATED_TITLE_MARK):
        figure.update_layout(title_text=title + SIMULATED_TITLE_MARK)
    return figure


def workload_shapes(results: SweepResults) -> list[tuple[str, list[CellOutcome]]]:
    """(label, finished cells) per workload shape, in the order the sweep lists them."""
    grouped: dict[str, list[CellOutcome]] = {}
    for cell in results.cells:
        if cell.ok:
            grouped.setdefault(cell.workload_shape, []).append(cell)
    shapes: list[tuple[str, list[CellOutcome]]] = []
    seen: dict[str, int] = {}
    for cells in grouped.values():
        label = cells[0].workload_text
        seen[label] = seen.get(label, 0) + 1
        shapes.append((label if seen[label] == 1 else f"{label} ({seen[label]})", cells))
    return shapes


def cell_label(cell: CellOutcome, many_deployments: bool) -> str:
    """'4 users' or 'replica-a · 4 users': how a cell is named in a legend."""
    level = level_label(cell) if cell.load_level is not None else cell.cell
    return f"{cell.deployment} · {level}" if many_deployments else level


def has_many_deployments(results: SweepResults) -> bool:
    return len({cell.deployment for cell in results.cells}) > 1


RecordSeries = list[tuple[str, list[RequestRecord]]]
"""(legend name, the cell's per-request records) for each cell drawn in one figure."""


def per_shape_record_charts(
    results: SweepResults, records_for: RecordsLoader, id_prefix: str, figure_for: Callable[[str, RecordSeries], go.Figure]
) -> list[tuple[str, str, go.Figure]]:
    """(workload label, element id, figure) per workload shape whose cells have stored records.

    Cells are ordered by deployment then load level; cells without records are left out.
    """
    many = has_many_deployments(results)
    charts: list[tuple[str, str, go.Figure]] = []
    for index, (label, cells) in enumerate(workload_shapes(results)):
        ordered = sorted(cells, key=lambda cell: (cell.deployment, cell.load_level or 0.0))
        series = [(cell_label(cell, many), records) for cell in ordered if (records := records_for(cell))]
        if series:
            charts.append((label, f"{id_prefix}-{index}", figure_for(label, series)))
    return charts
