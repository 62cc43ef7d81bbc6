"""Latency CDFs (TTFT, TPOT, E2E) drawn from the per-request records.

Percentiles in a table hide the shape: a CDF shows a bimodal TTFT (some requests queued,
some not) or a long E2E tail at a glance. Values come from the bench's own metric
definitions (`bench.metrics`), so a CDF and the summary's percentiles never disagree. Each
curve is thinned to at most `MAX_POINTS` quantiles, so a 100 000-request run keeps the page small.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmserve.report.plots_common import color, per_shape_record_charts, style
from vlmserve.report.run_records import RecordsLoader
from vlmserve.results.metrics import end_to_end_s, time_per_output_token_s, time_to_first_token_s
from vlmserve.results.records import RequestRecord
from vlmserve.sweep.results import SweepResults

MAX_POINTS = 200

CDF_METRICS: tuple[tuple[str, Callable[[RequestRecord], float | None]], ...] = (
    ("TTFT (ms)", time_to_first_token_s),
    ("TPOT (ms)", time_per_output_token_s),
    ("E2E (ms)", end_to_end_s),
)


def cdf_points(values_s: list[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """(milliseconds, cumulative fraction) of the empirical CDF, thinned to at most `max_points`."""
    data = np.sort(np.asarray(values_s, dtype=float)) * 1000.0
    if data.size == 0:
        return [], []
    fractions = np.arange(1, data.size + 1) / data.size
    if data.size > max_points:
        picks = np.unique(np.linspace(0, data.size - 1, max_points).round().astype(int))
        data, fractions = data[picks], fractions[picks]
    return data.tolist(), fractions.tolist()


def latency_cdf_figure(title: str, series: list[tuple[str, list[RequestRecord]]]) -> go.Figure:
    """Three panels (TTFT, TPOT, E2E), one curve per series of successful records."""
    figure = make_subplots(
        rows=1, cols=len(CDF_METRICS), subplot_titles=[name for name, _ in CDF_METRICS], horizontal_spacing=0.06
    )
    for index, (name, records) in enumerate(series):
        ok = [record for record in records if record.ok]
        for column, (_, metric) in enumerate(CDF_METRICS, start=1):
            values = [value for record in ok if (value := metric(record)) is not None]
            x, y = cdf_points(values)
            if not x:
                continue
            figure.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=column == 1,
                    line={"color": color(index), "shape": "hv"},
                ),
                row=1,
                col=column,
            )
    figure.update_yaxes(title_text="fraction of requests", range=[0, 1.02], row=1, col=1)
    for column, (axis, _) in enumerate(CDF_METRICS, start=1):
        figure.update_xaxes(title_text=axis, row=1, col=column)
    return style(figure, title)


def latency_cdf_charts(results: SweepResults, records_for: RecordsLoader) -> list[tuple[str, str, go.Figure]]:
    """(workload label, element id, figure) per workload shape whose cells have stored records."""
    return per_shape_record_charts(
        results, records_for, "chart-cdf", lambda label, series: latency_cdf_figure(f"Latency CDFs: {label}", series)
    )
