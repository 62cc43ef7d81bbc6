"""Where TTFT goes, per request type: one stacked bar per (cell, request type), per workload shape.

The parts are the means of results.breakdown (upload, frontend, queue, prefill), which add up
to the client's mean TTFT over the same requests; a cell measured without engine traces has
only upload and the rest ("after upload"). Image types are drawn again split into first
sight and repeats, where a multimodal cache shows (prefill and frontend shrink on repeats).
"""

from __future__ import annotations

import plotly.graph_objects as go

from vlmserve.report.plots_common import cell_label, has_many_deployments, style, workload_shapes
from vlmserve.results.summary import TtftBreakdown
from vlmserve.sweep.results import CellOutcome, SweepResults

SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("upload_ms", "upload", "#7f7f7f"),
    ("frontend_ms", "frontend (HTTP, input and image processing)", "#1f77b4"),
    ("queue_ms", "queue", "#ff7f0e"),
    ("prefill_ms", "prefill (vision encoder included)", "#d62728"),
    ("after_upload_ms", "after upload (no engine timings)", "#bcbd22"),
)
"""(breakdown field, legend name, colour) of each stacked segment, in the order a request meets them."""


def _bars(cell: CellOutcome, many: bool) -> list[tuple[str, TtftBreakdown]]:
    """(bar label, breakdown) for each request type of one cell, with the image types' first/repeat splits."""
    bars: list[tuple[str, TtftBreakdown]] = []
    prefix = cell_label(cell, many)
    summary = cell.summary
    for name, block in ((summary.by_type or {}) if summary is not None else {}).items():
        if block.breakdown is not None:
            bars.append((f"{prefix} · {name}", block.breakdown))
        for split, part in (block.by_repeat or {}).items():
            if part.breakdown is not None:
                bars.append((f"{prefix} · {name} {split}", part.breakdown))
    return bars


def _value(breakdown: TtftBreakdown, field: str) -> float | None:
    engine = breakdown.source == "engine spans"
    if field == "after_upload_ms":
        return None if engine else breakdown.after_upload_ms
    if not engine and field != "upload_ms":
        return None
    value = getattr(breakdown, field)
    return None if value is None else float(value)


def breakdown_figure(title: str, bars: list[tuple[str, TtftBreakdown]]) -> go.Figure:
    """Horizontal stacked bars, one per (cell, type), mean ms per part."""
    figure = go.Figure()
    labels = [label for label, _ in bars]
    for field, name, colour in SEGMENTS:
        values = [_value(breakdown, field) for _, breakdown in bars]
        if all(value is None for value in values):
            continue
        figure.add_trace(
            go.Bar(
                y=labels,
                x=[value or 0.0 for value in values],
                name=name,
                orientation="h",
                marker={"color": colour},
                customdata=[[breakdown.client_ttft_ms, breakdown.requests] for _, breakdown in bars],
                hovertemplate=f"{name}: %{{x:.1f}} ms<br>TTFT %{{customdata[0]:.1f}} ms over %{{customdata[1]}} requests"
                "<extra>%{y}</extra>",
            )
        )
    figure.update_layout(barmode="stack", yaxis={"autorange": "reversed"}, legend={"traceorder": "normal"})
    figure.update_xaxes(title_text="mean ms of the client's TTFT")
    return style(figure, title, height=max(300, 140 + 32 * len(bars)))


def breakdown_charts(results: SweepResults) -> list[tuple[str, str, go.Figure]]:
    """(workload label, element id, figure) per workload shape whose cells have a TTFT breakdown."""
    many = has_many_deployments(results)
    charts: list[tuple[str, str, go.Figure]] = []
    for index, (label, cells) in enumerate(workload_shapes(results)):
        ordered = sorted(cells, key=lambda cell: (cell.deployment, cell.load_level or 0.0))
        bars = [bar for cell in ordered for bar in _bars(cell, many)]
        if bars:
            charts.append(
                (label, f"chart-ttft-breakdown-{index}", breakdown_figure(f"Where TTFT goes, per request type: {label}", bars))
            )
    return charts
