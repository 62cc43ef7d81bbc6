"""The Markdown summary: the headline, the findings and every cell, ready to paste into a ticket."""

from __future__ import annotations

from pathlib import Path

from vlmserve.report.tables import Table, cell_table, features_table, headline_table, knee_sentences
from vlmserve.sweep.knee import no_knee_reason
from vlmserve.sweep.rank import cheapest, rank_deployments
from vlmserve.sweep.results import SIMULATED_NOTE, SweepResults


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: Table) -> str:
    """A GitHub-flavoured Markdown table; failed rows are marked ✗ and client-limited rows ⚠."""
    marks = {"failed": "✗ ", "limited": "⚠ ", "best": "★ "}
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    for row, flag in zip(table.rows, table.flags):
        values = [_escape(value) for value in row]
        values[0] = marks.get(flag, "") + values[0]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def render_markdown(results: SweepResults) -> str:
    choices = rank_deployments(results)
    parts = [f"## vlmserve report: {results.name}", "", f"**{results.outcome_line()}**", ""]
    parts += [f"> ⚠ {note}\n" for note in results.all_notes()]
    if results.simulated():
        parts += [f"_{SIMULATED_NOTE}_", ""]
    if results.slo.bounds_s:
        parts.append("SLOs: " + ", ".join(f"{key} ≤ {value * 1000:g} ms" for key, value in sorted(results.slo.bounds_s.items())))
        parts.append("")
    parts += [f"### {headline_table(results, choices).title}", "", table_markdown(headline_table(results, choices)), ""]
    findings = knee_sentences(results) or [no_knee_reason(results)]
    cheap = cheapest(choices)
    if cheap is not None:
        findings.append(
            f"cheapest per token: {cheap.deployment} at ${cheap.usd_per_million_output_tokens:.2f} per million output tokens"
        )
    if findings:
        parts += ["### Findings", ""] + [f"- {finding}" for finding in findings] + [""]
    cells = cell_table(results)
    parts += [f"### {cells.title}", "", table_markdown(cells), ""]
    features = features_table(results)
    if features is not None:
        parts += [f"### {features.title}", "", table_markdown(features), ""]
    parts.append("✗ failed · ⚠ client-limited (the load generator set the pace) · ★ best deployment")
    return "\n".join(parts) + "\n"


def write_markdown(results: SweepResults, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(results), encoding="utf-8")
    return path
