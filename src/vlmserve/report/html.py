"""The self-contained HTML report: one file, works offline (plotly.js embedded once, no CDN).

It answers "is it deployable, and in which configuration": the headline table first, then
the knee findings, the four load charts, per workload shape the latency-vs-throughput curve,
the latency CDFs and each run's timeline (the last two from the per-request records), every
cell's numbers, the failures, and the deployment specs and versions that produced them.
Every figure drawn from simulated runs carries the simulated mark in its own title.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from pydantic import ValidationError

from vlmserve import __version__
from vlmserve.json_types import JSONObject
from vlmserve.report.adapter_table import adapters_table
from vlmserve.report.charts import all_charts
from vlmserve.report.plots_breakdown import breakdown_charts
from vlmserve.report.plots_cdf import latency_cdf_charts
from vlmserve.report.plots_common import mark_simulated
from vlmserve.report.plots_latency_throughput import latency_vs_throughput_charts
from vlmserve.report.plots_timeline import timeline_charts
from vlmserve.report.run_records import RecordsLoader, stored_records
from vlmserve.report.tables import Table, cell_table, features_table, headline_table, knee_sentences
from vlmserve.spec import DeploymentSpec
from vlmserve.sweep.knee import no_knee_reason
from vlmserve.sweep.rank import cheapest, rank_deployments
from vlmserve.sweep.results import SIMULATED_NOTE, SweepResults

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1500px; color: #222; padding: 0 16px; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.sub { color: #666; margin-top: 0; }
.outcome { padding: 10px 14px; border-radius: 6px; background: #eef6ee; border: 1px solid #b6d8b6; }
.outcome.partial { background: #fff4e5; border-color: #f0c27b; }
.note { color: #8a5a00; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; width: 100%; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td:nth-child(-n+2), th:nth-child(-n+2) { text-align: left; }
td.reason { text-align: left; white-space: normal; max-width: 420px; font-family: monospace; font-size: 12px; }
tr.failed td { background: #fdecea; } tr.limited td { background: #fff8e1; } tr.best td { background: #e8f5e9; }
.charts { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
@media (max-width: 1000px) { .charts { grid-template-columns: minmax(0, 1fr); } }
.scroll { overflow-x: auto; }
.chart.wide { grid-column: 1 / -1; }
.chart { border: 1px solid #eee; border-radius: 6px; min-height: 420px; min-width: 0; overflow: hidden; }
pre { background: #f7f7f7; padding: 10px; overflow-x: auto; font-size: 12px; }
.legend span { display: inline-block; padding: 0 8px; margin-right: 8px; border-radius: 3px; }
"""


def _table_html(table: Table, reason_column: str | None = None) -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in table.columns)
    body: list[str] = []
    reason_index = table.columns.index(reason_column) if reason_column in table.columns else -1
    for row, flag in zip(table.rows, table.flags):
        cells = "".join(
            f'<td class="reason">{html.escape(value)}</td>' if index == reason_index else f"<td>{html.escape(value)}</td>"
            for index, value in enumerate(row)
        )
        body.append(f'<tr class="{flag}">{cells}</tr>')
    return (
        f'<h2>{html.escape(table.title)}</h2><div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _compact_spec(spec: JSONObject) -> JSONObject:
    """Only what differs from the defaults: the part of a deployment spec a reader needs."""
    try:
        return DeploymentSpec.model_validate(spec).model_dump(mode="json", exclude_defaults=True)
    except ValidationError:
        return {key: value for key, value in spec.items() if value not in (None, [], {})}


def _deployments_html(results: SweepResults) -> str:
    parts = ["<h2>Deployments: specs and versions</h2>"]
    for info in results.deployments:
        version = info.server_version or "not reported"
        status = info.status + (f": {info.reason}" if info.reason else "")
        where = f" · served at {html.escape(info.endpoint)}" if info.endpoint else ""
        header = (
            f"<h3>{html.escape(info.name)}</h3><p>{html.escape(info.kind)} · {info.devices:g} device(s) · "
            f"model {html.escape(str(info.model))} · server version {html.escape(version)}{where} · "
            f"status {html.escape(status)}</p>"
        )
        if info.spec is None:
            parts.append(header)
            continue
        compact = json.dumps(_compact_spec(info.spec), indent=2, sort_keys=True)
        full = json.dumps(info.spec, indent=2, sort_keys=True)
        parts.append(
            header + f"<pre>{html.escape(compact)}</pre>"
            f"<details><summary>full spec</summary><pre>{html.escape(full)}</pre></details>"
        )
    return "".join(parts)


def _features_html(results: SweepResults) -> str:
    """The feature-workload table, with what its columns mean; nothing when no cell ran --features."""
    table = features_table(results)
    if table is None:
        return ""
    return (
        _table_html(table, reason_column="invalid answers")
        + '<p class="legend">Schema-valid: answers that parse as JSON and validate against the response schema '
        "asked for; valid tool calls: every call names an offered tool and its arguments validate (both checked "
        "with jsonschema, over completed requests). First reasoning / first answer: from the send to the first "
        "reasoning token and to the first content or tool-call token. A row marked red missed a rate SLO.</p>"
    )


def _adapters_html(results: SweepResults) -> str:
    """The per-adapter table, with what its penalty column means; nothing when no cell ran --lora-adapters."""
    table = adapters_table(results)
    if table is None:
        return ""
    return (
        _table_html(table) + '<p class="legend">First-use penalty: the TTFT of the adapter\'s first request in '
        "the run (warm-up included) less the p50 TTFT of its later requests: what loading it, or waiting for a "
        "free adapter slot, cost that request. One request each: compare adapters, not single values.</p>"
    )


def _simulated_note(results: SweepResults) -> str:
    return f'<p class="note">{html.escape(SIMULATED_NOTE)}</p>' if results.simulated() else ""


def page_html(title: str, body: str) -> str:
    """A whole self-contained page: the report's style and plotly.js, inlined once, then `body`."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
{body}</body></html>
"""


def chart_html(element_id: str, figure: go.Figure, simulated: bool, wide: bool = False) -> str:
    """One figure as a div (plotly.js itself is on the page once), marked simulated when it is."""
    if simulated:
        mark_simulated(figure)
    classes = "chart wide" if wide else "chart"
    body = figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=element_id, config={"displaylogo": False, "responsive": True}
    )
    return f'<div class="{classes}">{body}</div>'


def shape_sections_html(results: SweepResults, records_for: RecordsLoader) -> str:
    """Per workload shape: latency vs achieved throughput, latency CDFs, the runs' timelines."""
    simulated = results.simulated()
    sections: dict[str, list[str]] = {}
    for charts in (
        latency_vs_throughput_charts(results),
        latency_cdf_charts(results, records_for),
        timeline_charts(results, records_for),
        breakdown_charts(results),
    ):
        for label, element_id, figure in charts:
            sections.setdefault(label, []).append(chart_html(element_id, figure, simulated, wide=True))
    if not sections:
        return ""
    parts = [
        "<h2>Per workload shape</h2>",
        '<p class="legend">Latency against the throughput the server achieved; CDFs and timelines come from '
        "the per-request records (left out for runs whose records are not stored). Where TTFT goes: the mean "
        "upload, frontend, queue and prefill of each request type (docs/metrics.md).</p>",
    ]
    for label, divs in sections.items():
        parts.append(f'<h3>{html.escape(label)}</h3><div class="charts">{"".join(divs)}</div>')
    return "".join(parts)


def render_html(results: SweepResults, records_for: RecordsLoader = stored_records) -> str:
    """The whole page as a string; `records_for` gives each cell's per-request records (the history's by default)."""
    choices = rank_deployments(results)
    done, total = results.counts()
    outcome_class = "outcome" if done == total else "outcome partial"
    knees = knee_sentences(results)
    cheap = cheapest(choices)
    findings = [html.escape(sentence) for sentence in knees]
    if cheap is not None:
        findings.append(
            html.escape(
                f"cheapest per token: {cheap.deployment} at ${cheap.usd_per_million_output_tokens:.2f} per million output tokens"
            )
        )
    if results.slo.bounds_s:
        slo_text = ", ".join(f"{key} ≤ {value * 1000:g} ms" for key, value in sorted(results.slo.bounds_s.items()))
    else:
        slo_text = "none given (best point = highest throughput)"
    simulated = results.simulated()
    chart_divs = "".join(chart_html(element_id, figure, simulated) for element_id, figure in all_charts(results))
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page_html(
        f"vlmserve report: {results.name}",
        f"""<h1>vlmserve report: {html.escape(results.name)}</h1>
<p class="sub">{html.escape(results.description or "")} source {html.escape(results.source)} · generated {generated}
 · vlmserve {__version__}</p>
<p class="{outcome_class}">{html.escape(results.outcome_line())}</p>
{"".join(f'<p class="note"><b>{html.escape(note)}</b></p>' for note in results.all_notes())}
{_simulated_note(results)}
<p>SLOs: {html.escape(slo_text)}</p>
{_table_html(headline_table(results, choices))}
<h2>Findings</h2>
<ul>{"".join(f"<li>{item}</li>" for item in findings) or f"<li>{html.escape(no_knee_reason(results))}</li>"}</ul>
<h2>Load charts</h2>
<p class="legend">Circles are measured points; crosses mark client-limited cells (the load generator set the pace).</p>
<div class="charts">{chart_divs}</div>
{shape_sections_html(results, records_for)}
{_table_html(cell_table(results), reason_column="run id / reason")}
{_features_html(results)}
{_adapters_html(results)}
<p class="legend"><span style="background:#fdecea">failed</span><span style="background:#fff8e1">client-limited</span>
<span style="background:#e8f5e9">best deployment</span></p>
{_deployments_html(results)}
""",
    )


def write_html(results: SweepResults, path: Path, records_for: RecordsLoader = stored_records) -> Path:
    """Write the report file (parent directories created) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(results, records_for), encoding="utf-8")
    return path
