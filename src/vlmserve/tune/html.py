"""The tune's evidence page: every candidate, its interval, predicted against measured, why it was dropped.

One self-contained file built with the report's page and chart helpers (plotly.js inlined once,
nothing fetched). Three charts: goodput per candidate with its interval (the planner's prediction
beside it), predicted against measured goodput, and the Pareto front of goodput per device
against p95 TTFT. Charts of sim-engine or planner figures carry the simulated mark in their titles.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import plotly.graph_objects as go

from vlmserve.report.html import chart_html, page_html
from vlmserve.report.plots_common import color, style
from vlmserve.tune.output import PREDICTED_NOTE, candidate_rows, measured_label
from vlmserve.tune.run import TuneOutcome
from vlmserve.tune.store import CandidateRecord

CHART_IDS = ("chart-tune-goodput", "chart-tune-predicted", "chart-tune-pareto")


def _short(record: CandidateRecord) -> str:
    return record.label.removeprefix("baseline: ")


def goodput_chart(outcome: TuneOutcome) -> go.Figure:
    measured = [record for record in sorted(outcome.records, key=lambda r: r.order) if record.status == "measured"]
    names = [
        ("★ " if outcome.recommendation.chosen and r.id == outcome.recommendation.chosen.id else "") + _short(r) for r in measured
    ]
    lows = [r.interval.low if r.interval else 0.0 for r in measured]
    highs = [r.interval.high if r.interval and r.interval.high is not None else low for r, low in zip(measured, lows)]
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=names,
            y=lows,
            name="goodput (held)",
            marker_color=color(0),
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [h - lo for h, lo in zip(highs, lows)],
                "arrayminus": [0.0] * len(lows),
            },
        )
    )
    figure.add_trace(
        go.Scatter(
            x=names,
            y=[r.predicted_rps for r in measured],
            mode="markers",
            name="predicted",
            marker={"symbol": "diamond", "size": 10, "color": color(1)},
        )
    )
    style(figure, "Goodput per measured candidate (bar: held; whisker: up to the rate that missed)")
    figure.update_layout(xaxis_title="candidate", yaxis_title="req/s meeting the SLOs")
    return figure


def predicted_chart(outcome: TuneOutcome) -> go.Figure:
    measured = [record for record in outcome.records if record.status == "measured" and record.predicted_rps is not None]
    figure = go.Figure()
    values = [record.goodput_rps or 0.0 for record in measured] + [record.predicted_rps or 0.0 for record in measured]
    top = max(values, default=1.0) or 1.0
    figure.add_trace(
        go.Scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured", line={"dash": "dot", "color": "#999"})
    )
    figure.add_trace(
        go.Scatter(
            x=[record.predicted_rps for record in measured],
            y=[record.goodput_rps for record in measured],
            mode="markers",
            name="candidates",
            text=[_short(record) for record in measured],
            marker={"size": 9, "color": color(0)},
        )
    )
    style(figure, "Predicted against measured goodput")
    figure.update_layout(xaxis_title="predicted req/s (planner)", yaxis_title="measured req/s")
    return figure


def pareto_chart(outcome: TuneOutcome) -> go.Figure:
    points = sorted(
        (
            (record.ttft_p95_ms, (record.goodput_rps or 0.0) / record.devices, record)
            for record in outcome.records
            if record.status == "measured" and record.ttft_p95_ms is not None and record.goodput_rps
        ),
        key=lambda point: (point[0], -point[1]),
    )
    front, best = [], -1.0
    for ttft, goodput, record in points:
        if goodput > best:
            front.append((ttft, goodput, record))
            best = goodput
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=[p[0] for p in points],
            y=[p[1] for p in points],
            mode="markers",
            name="candidates",
            text=[_short(p[2]) for p in points],
            marker={"size": 9, "color": color(0)},
        )
    )
    figure.add_trace(
        go.Scatter(
            x=[p[0] for p in front],
            y=[p[1] for p in front],
            mode="lines+markers",
            name="Pareto front",
            line={"color": color(2)},
            text=[_short(p[2]) for p in front],
        )
    )
    style(figure, "Goodput per device against p95 TTFT at that goodput")
    figure.update_layout(xaxis_title="TTFT p95 (ms) at the highest rate that held", yaxis_title="req/s per device")
    return figure


def _rows_html(outcome: TuneOutcome) -> str:
    columns = ("candidate", "status", "goodput req/s", "interval", "TTFT p95 ms", "predicted req/s (simulated)", "why", "log")
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = []
    chosen = outcome.recommendation.chosen
    for row in candidate_rows(outcome):
        interval = row.get("interval") or None
        interval_text = (
            ""
            if not interval
            else (
                f"[{interval['low']:g}, {interval['high']:g})" if interval.get("high") is not None else f"≥ {interval['low']:g}"
            )
        )
        cells = [
            row["label"],
            row["status"],
            _num(row.get("goodput_rps")),
            interval_text,
            _num(row.get("ttft_p95_ms")),
            _num(row.get("predicted_goodput_rps")) or (row.get("predicted_note") or ""),
            row["why"],
            row.get("log") or "",
        ]
        klass = (
            ' class="best"'
            if chosen is not None and row["id"] == chosen.id
            else (' class="failed"' if row["status"] == "failed" else "")
        )
        body.append(f"<tr{klass}>" + "".join(f'<td class="reason">{html.escape(str(cell))}</td>' for cell in cells) + "</tr>")
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _num(value: object) -> str:
    return "" if value is None else f"{value:g}"


def render_html(outcome: TuneOutcome) -> str:
    simulated = outcome.space.base.engine == "sim"
    recommendation = outcome.recommendation
    slo = ", ".join(f"{key} ≤ {value * 1000:g} ms" for key, value in outcome.settings.slo.bounds_s.items())
    notes = [f"Goodput: {measured_label(outcome)}.", f"Predictions: {PREDICTED_NOTE}."]
    if outcome.plan_note:
        notes.append(f"Planner: {outcome.plan_note}; candidates were measured in Optuna's order.")
    charts = [chart_html(CHART_IDS[0], goodput_chart(outcome), simulated, wide=True)]
    if any(record.predicted_rps is not None for record in outcome.records):  # nothing to compare without a planner
        charts.append(chart_html(CHART_IDS[1], predicted_chart(outcome), True))
    charts.append(chart_html(CHART_IDS[2], pareto_chart(outcome), simulated))
    body = f"""<h1>vlmserve tune: {html.escape(outcome.space.base.name)}</h1>
<p class="sub">SLO {html.escape(slo)}; rate range {outcome.settings.search.low:g}–{outcome.settings.search.high:g} req/s;
{len(outcome.records)} of {len(outcome.space.candidates())} candidates measured ({html.escape(outcome.stopped_by)})</p>
<p class="outcome">{html.escape(recommendation.sentence)}</p>
{"".join(f'<p class="note">{html.escape(note)}</p>' for note in notes)}
<h2>Charts</h2><div class="charts">{"".join(charts)}</div>
<h2>Every candidate</h2>{_rows_html(outcome)}
<h2>Search space</h2><pre>{html.escape(json.dumps({axis.name: list(axis.values) for axis in outcome.space.axes}, indent=2))}</pre>
"""
    return page_html(f"vlmserve tune {outcome.space.base.name}", body)


def write_html(outcome: TuneOutcome, path: Path) -> Path:
    path.write_text(render_html(outcome), encoding="utf-8")
    return path
