"""The report's plots (plotly figures): throughput, TTFT tail and TPOT against load, and the Pareto front.

Each series is one deployment × one workload shape, so a prompt-length study shows one
curve per prompt length and a replica study one curve per replica count. Client-limited
points are drawn as crosses: there the load generator, not the server, set the pace.
"""

from __future__ import annotations

import plotly.graph_objects as go

from vlmserve.report.plots_common import PALETTE as _PALETTE
from vlmserve.report.tables import level_label, workload_label
from vlmserve.sweep.results import CellOutcome, SweepResults

_PERCENTILE_DASH = {"p50": "solid", "p95": "dash", "p99": "dot"}


def _series(results: SweepResults) -> list[tuple[str, list[CellOutcome]]]:
    """Successful cells grouped into curves, each sorted by load level."""
    grouped: dict[str, list[CellOutcome]] = {}
    for cell in results.cells:
        if cell.ok and cell.load_level is not None:
            grouped.setdefault(cell.series_key, []).append(cell)
    many_deployments = len({cell.deployment for cell in results.cells}) > 1
    named: list[tuple[str, list[CellOutcome]]] = []
    for cells in grouped.values():
        cells.sort(key=lambda cell: cell.load_level or 0.0)
        label = workload_label(cells[0])
        if many_deployments:
            label = f"{cells[0].deployment} · {label}"
        named.append((label, cells))
    return named


def _x_title(results: SweepResults) -> str:
    names = {cell.load_level_name for cell in results.cells if cell.ok}
    return "concurrent users" if names == {"concurrency"} else "load (users or req/s)"


def _layout(figure: go.Figure, title: str, x_title: str, y_title: str, log_levels: list[float] | None = None) -> go.Figure:
    figure.update_layout(
        title=title,
        xaxis_title=x_title,
        yaxis_title=y_title,
        template="plotly_white",
        height=420,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"font": {"size": 11}},
        hovermode="closest",
    )
    if log_levels:
        figure.update_xaxes(type="log", tickvals=log_levels, ticktext=[f"{level:g}" for level in log_levels])
    return figure


def _markers(cells: list[CellOutcome]) -> list[str]:
    return ["x" if cell.client_limited else "circle" for cell in cells]


def _hover(cells: list[CellOutcome]) -> list[str]:
    return [f"{cell.deployment}/{cell.cell}" + (" (client-limited)" if cell.client_limited else "") for cell in cells]


def _wide_load_range(results: SweepResults) -> list[float] | None:
    """The measured load levels when they span 16× or more (then the x axis is logarithmic), else None."""
    levels = sorted({cell.load_level for cell in results.cells if cell.ok and cell.load_level})
    return levels if levels and levels[-1] / levels[0] >= 16 else None


def throughput_chart(results: SweepResults) -> go.Figure:
    """Output tokens/s against load: where the curve flattens, more users only add queueing."""
    figure = go.Figure()
    for index, (label, cells) in enumerate(_series(results)):
        figure.add_trace(
            go.Scatter(
                x=[cell.load_level for cell in cells],
                y=[cell.metric("throughput.output_tokens_per_s") for cell in cells],
                mode="lines+markers",
                name=label,
                text=_hover(cells),
                marker={"symbol": _markers(cells), "size": 9, "color": _PALETTE[index % len(_PALETTE)]},
                line={"color": _PALETTE[index % len(_PALETTE)]},
            )
        )
    return _layout(figure, "Throughput vs load", _x_title(results), "output tokens/s", _wide_load_range(results))


def ttft_chart(results: SweepResults) -> go.Figure:
    """TTFT p50, p95 and p99 against load: the tail made visible."""
    figure = go.Figure()
    for index, (label, cells) in enumerate(_series(results)):
        color = _PALETTE[index % len(_PALETTE)]
        for percentile, dash in _PERCENTILE_DASH.items():
            figure.add_trace(
                go.Scatter(
                    x=[cell.load_level for cell in cells],
                    y=[cell.metric(f"ttft_ms.{percentile}") for cell in cells],
                    mode="lines+markers",
                    name=f"{label} {percentile}",
                    legendgroup=label,
                    text=_hover(cells),
                    marker={"symbol": _markers(cells), "size": 7, "color": color},
                    line={"color": color, "dash": dash},
                )
            )
    for key, bound_s in results.slo.bounds_s.items():
        if key.startswith("ttft_"):
            figure.add_hline(
                y=bound_s * 1000.0,
                line_dash="dashdot",
                line_color="#555",
                annotation_text=f"SLO {key}",
                annotation_position="top left",
            )
    return _layout(
        figure, "TTFT p50 / p95 / p99 vs load", _x_title(results), "time to first token (ms)", _wide_load_range(results)
    )


def tpot_chart(results: SweepResults) -> go.Figure:
    """Time per output token (p50 and p95) against load: what each user feels while streaming."""
    figure = go.Figure()
    for index, (label, cells) in enumerate(_series(results)):
        color = _PALETTE[index % len(_PALETTE)]
        for percentile in ("p50", "p95"):
            figure.add_trace(
                go.Scatter(
                    x=[cell.load_level for cell in cells],
                    y=[cell.metric(f"tpot_ms.{percentile}") for cell in cells],
                    mode="lines+markers",
                    name=f"{label} {percentile}",
                    legendgroup=label,
                    text=_hover(cells),
                    marker={"symbol": _markers(cells), "size": 7, "color": color},
                    line={"color": color, "dash": _PERCENTILE_DASH[percentile]},
                )
            )
    return _layout(figure, "TPOT vs load", _x_title(results), "time per output token (ms)", _wide_load_range(results))


def pareto_points(results: SweepResults) -> list[tuple[float, float, CellOutcome]]:
    """(tokens/s per user, output tokens/s per device, cell) for every cell that ran."""
    devices = {info.name: info.devices for info in results.deployments}
    points: list[tuple[float, float, CellOutcome]] = []
    for cell in results.cells:
        tpot = cell.metric("tpot_ms.p50")
        tokens = cell.metric("throughput.output_tokens_per_s")
        if not cell.ok or not tpot or tokens is None:
            continue
        points.append((1000.0 / tpot, tokens / devices.get(cell.deployment, 1.0), cell))
    return points


def pareto_front(points: list[tuple[float, float, CellOutcome]]) -> list[tuple[float, float, CellOutcome]]:
    """Points no other point beats on both axes (faster per user and more per device), by per-user speed."""
    front: list[tuple[float, float, CellOutcome]] = []
    best_y = float("-inf")
    for point in sorted(points, key=lambda item: (-item[0], -item[1])):
        if point[1] > best_y:
            front.append(point)
            best_y = point[1]
    return front


def pareto_chart(results: SweepResults) -> go.Figure:
    """Latency–throughput trade-off across deployments: per-user speed vs per-device throughput."""
    figure = go.Figure()
    points = pareto_points(results)
    for index, info in enumerate(results.deployments):
        mine = [point for point in points if point[2].deployment == info.name]
        if not mine:
            continue
        figure.add_trace(
            go.Scatter(
                x=[point[0] for point in mine],
                y=[point[1] for point in mine],
                mode="markers",
                name=info.name,
                text=[f"{point[2].cell} ({_load_words(point[2])})" for point in mine],
                marker={
                    "size": 10,
                    "color": _PALETTE[index % len(_PALETTE)],
                    "symbol": ["x" if point[2].client_limited else "circle" for point in mine],
                },
            )
        )
    front = pareto_front(points)
    if front:
        figure.add_trace(
            go.Scatter(
                x=[point[0] for point in front],
                y=[point[1] for point in front],
                mode="lines+markers",
                name="Pareto front",
                line={"color": "#333", "dash": "dash"},
                hoverinfo="skip",
                marker={"size": 16, "symbol": "circle-open", "color": "#333"},
            )
        )
    figure = _layout(
        figure, "Latency–throughput Pareto front", "tokens/s per user (1000 / TPOT p50 ms)", "output tokens/s per device"
    )
    speeds = [point[0] for point in points if point[0] > 0]
    if speeds and max(speeds) / min(speeds) >= 30:  # bursty streams (TPOT near 0) would squash the rest
        figure.update_xaxes(type="log")
    return figure


def _load_words(cell: CellOutcome) -> str:
    """'4 users' / '2 req/s', or 'load unknown' for an imported run whose file did not say."""
    return "load unknown" if cell.load_level is None else level_label(cell)


def all_charts(results: SweepResults) -> list[tuple[str, go.Figure]]:
    """(element id, figure) for every chart of the report, in page order."""
    return [
        ("chart-throughput", throughput_chart(results)),
        ("chart-ttft", ttft_chart(results)),
        ("chart-tpot", tpot_chart(results)),
        ("chart-pareto", pareto_chart(results)),
    ]
