"""`vlmserve compare --html OUT`: the comparison as one self-contained page, with plots of both runs.

The console comparison gives ratios and regressions; the page adds what ratios hide: both
sides' latency against achieved throughput, and for each matched cell the two latency CDFs
and the two timelines overlaid (from the stored per-request records). Which changes count as
regressions is decided by `report.compare` alone; this page only shows its verdicts. Either
side being simulated is said in the banner and in every plot title.
"""

from __future__ import annotations

import html
from pathlib import Path

from vlmserve.report.compare import Comparison, match_cells
from vlmserve.report.html import chart_html, page_html
from vlmserve.report.plots_cdf import latency_cdf_figure
from vlmserve.report.plots_latency_throughput import latency_vs_throughput_figure
from vlmserve.report.plots_timeline import timeline_figure
from vlmserve.report.run_records import RecordsLoader, stored_records
from vlmserve.report.tables import fmt
from vlmserve.sweep.results import SIMULATED_NOTE, CellOutcome, SweepResults

SIDES = ("baseline", "candidate")


def _simulated_banner(comparison: Comparison) -> str:
    sides = [name for name, results in zip(SIDES, (comparison.baseline, comparison.candidate)) if results.simulated()]
    if not sides:
        return ""
    return f'<p class="note"><b>{" and ".join(sides)} simulated.</b> {html.escape(SIMULATED_NOTE)}</p>'


def _verdicts_html(comparison: Comparison) -> str:
    regressions = comparison.regressions()
    basis = html.escape(comparison.basis())
    if not regressions:
        return f'<p class="outcome">no regression beyond {basis}</p>'
    items = "".join(f"<li>{html.escape(line)}</li>" for line in regressions)
    return f'<p class="outcome partial">{len(regressions)} regression(s) beyond {basis}</p><ul>{items}</ul>'


def _cell_table_html(comparison: Comparison) -> str:
    parts: list[str] = []
    for cell in comparison.cells:
        rows = []
        for change in cell.changes:
            regression = change.is_regression(comparison.threshold, comparison.min_effect)
            rows.append(
                f'<tr class="{"failed" if regression else ""}"><td>{html.escape(change.metric.label)}</td>'
                f"<td>{fmt(change.baseline, 2)}</td><td>{fmt(change.candidate, 2)}</td>"
                f"<td>{html.escape(change.phrase())}</td><td>{'regression' if regression else ''}</td></tr>"
            )
        warning = ""
        if cell.load_differences:
            warning = (
                f'<p class="note">the loads differ ({html.escape("; ".join(cell.load_differences))}): '
                "these ratios compare different workloads</p>"
            )
        if cell.unknown or cell.load_unknown:
            warning += (
                f'<p class="note">not compared, unknown on one side: '
                f"{html.escape(', '.join(cell.unknown + cell.load_unknown))}</p>"
            )
        parts.append(
            f'<h3>{html.escape(cell.name)} ({html.escape(cell.level)})</h3>{warning}<div class="scroll">'
            "<table><thead><tr><th>metric</th><th>baseline</th><th>candidate</th>"
            "<th>candidate vs baseline</th><th>verdict</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>"
        )
    return "".join(parts)


def _matched_pairs(comparison: Comparison) -> list[tuple[str, CellOutcome, CellOutcome]]:
    """The cell pairs compare matched (its own matching rule, so the plots show what the tables compare)."""
    return match_cells(comparison.baseline, comparison.candidate)[0]


def _ok_cells(results: SweepResults) -> list[CellOutcome]:
    return [cell for cell in results.cells if cell.ok]


def _plots_html(comparison: Comparison, records_for: RecordsLoader) -> str:
    simulated = comparison.baseline.simulated() or comparison.candidate.simulated()
    charts = [
        chart_html(
            "chart-compare-latency-throughput",
            latency_vs_throughput_figure(
                "Latency vs achieved throughput: baseline and candidate",
                [("baseline", _ok_cells(comparison.baseline)), ("candidate", _ok_cells(comparison.candidate))],
            ),
            simulated,
            wide=True,
        )
    ]
    missing: list[str] = []
    for index, (name, base, cand) in enumerate(_matched_pairs(comparison)):
        series = [(side, records_for(cell)) for side, cell in zip(SIDES, (base, cand))]  # a side keeps its colour
        if not all(records for _, records in series):
            missing.append(name)
        if not any(records for _, records in series):
            continue
        charts.append(
            chart_html(f"chart-compare-cdf-{index}", latency_cdf_figure(f"Latency CDFs: {name}", series), simulated, wide=True)
        )
        charts.append(
            chart_html(
                f"chart-compare-timeline-{index}",
                timeline_figure(f"Over time within each run: {name}", series),
                simulated,
                wide=True,
            )
        )
    note = (
        (
            f'<p class="note">per-request records not stored for one side of {html.escape(", ".join(missing))}: '
            "its CDF and timeline show only the other side</p>"
        )
        if missing
        else ""
    )
    return f'<h2>Plots</h2>{note}<div class="charts">{"".join(charts)}</div>'


def render_compare_html(comparison: Comparison, records_for: RecordsLoader = stored_records) -> str:
    """The whole comparison page as a string."""
    base, cand = comparison.baseline, comparison.candidate
    headlines = "".join(f"<li>{html.escape(line)}</li>" for line in comparison.headlines())
    unmatched = (
        f'<p class="note">not compared (only on one side): {html.escape(", ".join(comparison.unmatched))}</p>'
        if comparison.unmatched
        else ""
    )
    body = f"""<h1>vlmserve compare</h1>
<p class="sub">baseline <b>{html.escape(base.source)}</b> ({html.escape(base.name)}) vs candidate
<b>{html.escape(cand.source)}</b> ({html.escape(cand.name)})</p>
{_simulated_banner(comparison)}
{_verdicts_html(comparison)}
<ul>{headlines}</ul>
{unmatched}
<h2>Matched cells</h2>
{_cell_table_html(comparison)}
{_plots_html(comparison, records_for)}
"""
    return page_html(f"vlmserve compare: {base.source} vs {cand.source}", body)


def write_compare_html(comparison: Comparison, path: Path, records_for: RecordsLoader = stored_records) -> Path:
    """Write the comparison page (parent directories created) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_compare_html(comparison, records_for), encoding="utf-8")
    return path
