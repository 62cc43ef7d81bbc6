"""TTFT and TPOT (p50, p95) against achieved throughput across load levels: the curve engineers read first.

The x axis is what the server delivered (output tokens/s), not what was asked of it, so a
curve bends back where more load no longer buys throughput and only adds latency. One
figure per workload shape; one curve per deployment (or per compared run), points in load
order, client-limited points drawn as crosses.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmserve.report.plots_common import color, style, workload_shapes
from vlmserve.sweep.results import CellOutcome, SweepResults

PANELS: tuple[tuple[str, str], ...] = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"))
"""(summary block, axis title) of each panel, left to right."""

PERCENTILE_DASH = {"p50": "solid", "p95": "dash"}
THROUGHPUT_PATH = "throughput.output_tokens_per_s"


def latency_vs_throughput_figure(title: str, series: list[tuple[str, list[CellOutcome]]]) -> go.Figure:
    """Two panels (TTFT, TPOT); each series gives a p50 and a p95 curve against achieved output tokens/s."""
    figure = make_subplots(rows=1, cols=len(PANELS), subplot_titles=[axis for _, axis in PANELS], horizontal_spacing=0.08)
    for index, (name, cells) in enumerate(series):
        ordered = sorted(cells, key=lambda cell: cell.load_level or 0.0)
        for column, (block, _) in enumerate(PANELS, start=1):
            for percentile, dash in PERCENTILE_DASH.items():
                points = [(cell.metric(THROUGHPUT_PATH), cell.metric(f"{block}.{percentile}"), cell) for cell in ordered]
                points = [(x, y, cell) for x, y, cell in points if x is not None and y is not None]
                if not points:
                    continue
                figure.add_trace(
                    go.Scatter(
                        x=[x for x, _, _ in points],
                        y=[y for _, y, _ in points],
                        mode="lines+markers",
                        name=f"{name} {percentile}",
                        legendgroup=f"{name} {percentile}",
                        showlegend=column == 1,
                        text=[
                            f"{cell.deployment}/{cell.cell}" + (" (client-limited)" if cell.client_limited else "")
                            for _, _, cell in points
                        ],
                        marker={
                            "symbol": ["x" if cell.client_limited else "circle" for _, _, cell in points],
                            "size": 8,
                            "color": color(index),
                        },
                        line={"color": color(index), "dash": dash},
                    ),
                    row=1,
                    col=column,
                )
    figure.update_xaxes(title_text="achieved output tokens/s")
    for column, (_, axis) in enumerate(PANELS, start=1):
        figure.update_yaxes(title_text=axis, row=1, col=column)
    return style(figure, title)


def latency_vs_throughput_charts(results: SweepResults) -> list[tuple[str, str, go.Figure]]:
    """(workload label, element id, figure) per workload shape, one curve per deployment."""
    charts: list[tuple[str, str, go.Figure]] = []
    for index, (label, cells) in enumerate(workload_shapes(results)):
        by_deployment: dict[str, list[CellOutcome]] = {}
        for cell in cells:
            by_deployment.setdefault(cell.deployment, []).append(cell)
        figure = latency_vs_throughput_figure(f"Latency vs achieved throughput: {label}", list(by_deployment.items()))
        charts.append((label, f"chart-latency-throughput-{index}", figure))
    return charts
