"""The scaling timeline of a `--load-shape` run as a page: SLO attainment per window, with the
replica count drawn over it and each scale-up (from the first miss to the last replica in
rotation) and scale-down shaded; marked simulated when the run was on sim engines."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmserve.errors import UserError
from vlmserve.report.html import chart_html, page_html
from vlmserve.report.plots_common import color, style
from vlmserve.results.blocks import ScalingBlock
from vlmserve.results.summary import RunSummary


def scaling_figure(scaling: ScalingBlock) -> go.Figure:
    """Attainment bars per window (left axis), replicas in rotation as a step line (right axis)."""
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    windows = scaling.windows
    figure.add_trace(
        go.Bar(
            x=[w.start_s + scaling.window_s / 2 for w in windows],
            y=[None if w.attainment is None else 100 * w.attainment for w in windows],
            width=scaling.window_s * 0.9,
            name="requests meeting the SLO (%)",
            marker_color=color(0),
            opacity=0.6,
            customdata=[[w.requests, w.failed] for w in windows],
            hovertemplate="%{y:.0f} %% of %{customdata[0]} sent (%{customdata[1]} failed)<extra></extra>",
        ),
        secondary_y=False,
    )
    timeline = scaling.replicas_timeline or []
    if timeline:
        figure.add_trace(
            go.Scatter(
                x=[at for at, _ in timeline],
                y=[count for _, count in timeline],
                mode="lines",
                line={"shape": "hv", "width": 3, "color": color(1)},
                name="replicas in rotation",
            ),
            secondary_y=True,
        )
    for event in scaling.scale_ups:
        figure.add_vrect(
            x0=event.began_s,
            x1=event.last_joined_s,
            fillcolor=color(3),
            opacity=0.15,
            line_width=0,
            annotation_text=f"scale-up: {event.missed_during} missed",
            annotation_position="top left",
        )
    for down in scaling.scale_downs:
        figure.add_vline(
            x=down.seen_s,
            line_dash="dot",
            line_color=color(2),
            annotation_text=f"scale-down: {down.failed} failed",
            annotation_position="bottom right",
        )
    figure.update_xaxes(title_text=f"seconds from the first request (windows of {scaling.window_s:g} s)")
    figure.update_yaxes(title_text="met the SLO (%)", range=[0, 105], secondary_y=False)
    figure.update_yaxes(title_text="replicas", rangemode="tozero", dtick=1, secondary_y=True)
    return style(figure, f"SLO attainment and replicas over time: {scaling.load_shape}")


def write_scaling_html(summary: RunSummary, path: Path) -> Path:
    """Write the page; UserError when the folder cannot be written."""
    assert summary.scaling is not None
    simulated = summary.meta.simulated
    note = '<p class="note">SIMULATED: measured against sim engines (vlmserve engine sim), not hardware.</p>' if simulated else ""
    rows = "".join(
        f"<li>scale-up {e.replicas_before:g} → {e.replicas_after:g}: {e.missed_during} of {e.requests_during} "
        f"requests missed the SLO while it started ({e.began_s:g}–{e.last_joined_s:g} s); "
        f"{e.missed_after} of {e.requests_after} after</li>"
        for e in summary.scaling.scale_ups
    )
    rows += "".join(
        f"<li>scale-down {e.replicas_before:g} → {e.replicas_after:g} at {e.seen_s:g} s: "
        f"{e.failed} of {e.requests_in_flight} requests in flight failed</li>"
        for e in summary.scaling.scale_downs
    )
    body = (
        f"<h1>Scaling timeline: run {html.escape(summary.meta.run_id or '')}</h1>{note}"
        f"{chart_html('scaling', scaling_figure(summary.scaling), simulated, wide=True)}<ul>{rows}</ul>"
    )
    try:
        path.write_text(page_html("vlmserve scaling timeline", body))
    except OSError as err:
        raise UserError(f"--html-out {path}: cannot write it ({err.strerror}); pick a writable path") from None
    return path
