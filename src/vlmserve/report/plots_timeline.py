"""Latency and throughput over time within a run, bucketed by second from the records' timestamps.

A run's summary averages over its whole window; the timeline shows what the average
hides: a warm-up ramp, a queue that keeps growing (the run was past saturation), a stall.
Each bucket counts what happened in it: TTFT of requests sent in that second, TPOT of
requests that finished in it, output tokens that arrived in it (from the chunk times, or
at the finish when a record has none). Time zero is the run's first send. Buckets are one
second; runs shorter than `MIN_BUCKETS` seconds (smoke runs) get finer buckets, so they
still draw a line, and the axis title says the bucket size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vlmserve.report.plots_common import color, per_shape_record_charts, style
from vlmserve.report.run_records import RecordsLoader
from vlmserve.results.metrics import time_per_output_token_s
from vlmserve.results.records import RequestRecord
from vlmserve.sweep.results import SweepResults

BUCKET_S = 1.0
MIN_BUCKETS = 10
_FINER_BUCKETS_S = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01)


def bucket_size_s(runs: list[list[RequestRecord]]) -> float:
    """One second, or the largest finer bucket giving the longest run `MIN_BUCKETS` buckets."""
    spans = [
        max(record.finished_at_s or record.sent_at_s for record in records) - min(record.sent_at_s for record in records)
        for records in runs
        if records
    ]
    longest = max(spans, default=0.0)
    if longest >= MIN_BUCKETS * BUCKET_S:
        return BUCKET_S
    return next((size for size in _FINER_BUCKETS_S if longest >= MIN_BUCKETS * size), _FINER_BUCKETS_S[-1])


@dataclass
class Timeline:
    """Per-bucket figures of one run; `start_s` of each bucket is seconds since the first send."""

    start_s: list[float] = field(default_factory=list)
    ttft_p50_ms: list[float | None] = field(default_factory=list)
    tpot_p50_ms: list[float | None] = field(default_factory=list)
    output_tokens_per_s: list[float] = field(default_factory=list)


def _median_ms(values_s: list[float]) -> float | None:
    return float(np.median(values_s)) * 1000.0 if values_s else None


def timeline(records: list[RequestRecord], bucket_s: float = BUCKET_S) -> Timeline:
    """Bucket a run's records by `bucket_s` seconds from its first send."""
    if not records:
        return Timeline()
    origin = min(record.sent_at_s for record in records)
    last = max([record.finished_at_s or record.sent_at_s for record in records])
    count = int((last - origin) // bucket_s) + 1

    def bucket(moment: float) -> int:
        return min(max(int((moment - origin) // bucket_s), 0), count - 1)

    ttfts: list[list[float]] = [[] for _ in range(count)]
    tpots: list[list[float]] = [[] for _ in range(count)]
    tokens = np.zeros(count)
    for record in records:
        if not record.ok:
            continue
        if record.ttft_s is not None:
            ttfts[bucket(record.sent_at_s)].append(record.ttft_s)
        tpot = time_per_output_token_s(record)
        if tpot is not None and record.finished_at_s is not None:
            tpots[bucket(record.finished_at_s)].append(tpot)
        if record.chunk_times_s:
            carried = (
                record.chunk_tokens if len(record.chunk_tokens) == len(record.chunk_times_s) else [1] * len(record.chunk_times_s)
            )
            for moment, amount in zip(record.chunk_times_s, carried):
                tokens[bucket(moment)] += amount
        elif record.output_tokens and record.finished_at_s is not None:
            tokens[bucket(record.finished_at_s)] += record.output_tokens
    return Timeline(
        start_s=[index * bucket_s for index in range(count)],
        ttft_p50_ms=[_median_ms(values) for values in ttfts],
        tpot_p50_ms=[_median_ms(values) for values in tpots],
        output_tokens_per_s=(tokens / bucket_s).tolist(),
    )


ROWS: tuple[tuple[str, str], ...] = (
    ("ttft_p50_ms", "TTFT p50 (ms), by send time"),
    ("tpot_p50_ms", "TPOT p50 (ms), by finish time"),
    ("output_tokens_per_s", "output tokens/s"),
)


def timeline_figure(title: str, series: list[tuple[str, list[RequestRecord]]]) -> go.Figure:
    """Three stacked panels sharing the time axis; one line per run."""
    figure = make_subplots(
        rows=len(ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.07, subplot_titles=[axis for _, axis in ROWS]
    )
    bucket_s = bucket_size_s([records for _, records in series])
    for index, (name, records) in enumerate(series):
        line = timeline(records, bucket_s)
        for row, (attribute, _) in enumerate(ROWS, start=1):
            figure.add_trace(
                go.Scatter(
                    x=line.start_s,
                    y=getattr(line, attribute),
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=row == 1,
                    connectgaps=False,
                    marker={"size": 4, "color": color(index)},
                    line={"color": color(index)},
                ),
                row=row,
                col=1,
            )
    figure.update_xaxes(title_text=f"seconds since the run's first send ({bucket_s:g} s buckets)", row=len(ROWS), col=1)
    return style(figure, title, height=620)


def timeline_charts(results: SweepResults, records_for: RecordsLoader) -> list[tuple[str, str, go.Figure]]:
    """(workload label, element id, figure) per workload shape whose cells have stored records."""
    return per_shape_record_charts(
        results,
        records_for,
        "chart-timeline",
        lambda label, series: timeline_figure(f"Over time within each run: {label}", series),
    )
