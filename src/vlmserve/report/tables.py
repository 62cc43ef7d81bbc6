"""The tables every report shows, built once and rendered as HTML, Markdown or a rich console table.

Formatting lives here so the three renderers cannot disagree about a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.sweep.knee import Knee, find_knees
from vlmserve.sweep.rank import DeploymentChoice, rank_deployments, slo_misses
from vlmserve.sweep.results import CellOutcome, SweepResults


@dataclass
class Table:
    """Columns and already formatted rows; `flags` marks rows a renderer should highlight."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    flags: list[str]
    """Per row: '' (normal), 'failed', 'limited' (client-limited), 'best'."""

    def select(self, columns: list[str]) -> "Table":
        """The same table with only `columns` (those it has), for narrow outputs like a terminal."""
        keep = [self.columns.index(column) for column in columns if column in self.columns]
        return Table(self.title, [self.columns[i] for i in keep], [[row[i] for i in keep] for row in self.rows], list(self.flags))


def fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    """A number for a table cell: '—' when missing, thousands separated when large."""
    if value is None:
        return "—"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    else:
        text = f"{value:.{digits}f}"
    return f"{text}{unit}"


def workload_label(cell: CellOutcome) -> str:
    """A short description of what a cell sends (one definition: `CellOutcome.workload_text`)."""
    return cell.workload_text


def level_label(cell: CellOutcome) -> str:
    level = cell.load_level
    if level is None:
        return "—"
    return f"{level:g} users" if cell.load_level_name == "concurrency" else f"{level:g} req/s"


def knee_for(knees: list[Knee], deployment: str) -> str:
    """The knees of one deployment as 'c=16 (random 512→64)' text, or '—'."""
    found = [knee for knee in knees if knee.deployment == deployment]
    if not found:
        return "—"
    return ", ".join(f"{knee.level_name} {knee.knee_level:g} ({knee.knee_cell})" for knee in found)


def headline_table(results: SweepResults, choices: list[DeploymentChoice] | None = None) -> Table:
    """One row per deployment, best first: its best operating point and what it costs."""
    choices = choices if choices is not None else rank_deployments(results)
    knees = find_knees(results)
    priced = any(choice.usd_per_million_output_tokens is not None for choice in choices)
    columns = [
        "rank",
        "deployment",
        "devices",
        "cells ok",
        "best point",
        "goodput req/s",
        "goodput/dev",
        "tok/s/dev",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "TPOT p50 ms",
        "knee",
    ]
    if priced:
        columns.append("$ / 1M out tok")
    rows: list[list[str]] = []
    flags: list[str] = []
    for index, choice in enumerate(choices, start=1):
        cells = results.cells_of(choice.deployment)
        best = next((cell for cell in cells if cell.cell == choice.best_cell), None)
        ok = sum(1 for cell in cells if cell.ok)
        row = [
            str(index) if choice.best_cell else "—",
            choice.deployment,
            fmt(choice.devices, 0),
            f"{ok}/{len(cells)}",
            choice.best_cell or choice.note or "—",
            fmt(choice.goodput_rps, 2),
            fmt(choice.goodput_per_device, 2),
            fmt(choice.output_tokens_per_s_per_device, 1),
            fmt(best.metric("ttft_ms.p50") if best else None),
            fmt(best.metric("ttft_ms.p95") if best else None),
            fmt(best.metric("tpot_ms.p50") if best else None, 2),
            knee_for(knees, choice.deployment),
        ]
        if priced:
            row.append(fmt(choice.usd_per_million_output_tokens, 2))
        rows.append(row)
        flags.append("best" if index == 1 and choice.best_cell else ("failed" if not choice.best_cell else ""))
    shapes = {cell.workload_shape for cell in results.cells}
    workload = choices[0].workload if choices and len(shapes) > 1 else ""
    title = "Headline: best operating point per deployment" + (
        f" (workload {workload}, the sweep's main shape)" if workload else ""
    )
    return Table(title, columns, rows, flags)


def cell_table(results: SweepResults) -> Table:
    """Every cell with its numbers; failed and client-limited cells marked."""
    columns = [
        "deployment",
        "cell",
        "workload",
        "load",
        "status",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p95",
        "TTFT p99",
        "TPOT p50",
        "ITL p95",
        "E2E p95",
        "failed req",
        "SLO",
        "run id / reason",
    ]
    rows: list[list[str]] = []
    flags: list[str] = []
    for cell in results.cells:
        if cell.ok:
            misses = slo_misses(cell, results.slo) if results.slo.bounds_s else []
            slo_text = "met" if results.slo.bounds_s and not misses else ("; ".join(misses) or "—")
            status = "client-limited" if cell.client_limited else "ok"
            tail = cell.run_id or ""
            reasons = cell.summary.client.limited_reasons if cell.summary is not None else []
            if cell.client_limited and reasons:
                tail += f" (client: {'; '.join(str(reason) for reason in reasons)})"
        else:
            slo_text = "—"
            status = cell.status
            tail = cell.reason or ""
        rows.append(
            [
                cell.deployment,
                cell.cell,
                workload_label(cell),
                level_label(cell),
                status,
                fmt(cell.metric("throughput.requests_per_s"), 2),
                fmt(cell.metric("throughput.output_tokens_per_s")),
                fmt(cell.metric("ttft_ms.p50")),
                fmt(cell.metric("ttft_ms.p95")),
                fmt(cell.metric("ttft_ms.p99")),
                fmt(cell.metric("tpot_ms.p50"), 2),
                fmt(cell.metric("itl_ms.p95"), 2),
                fmt(cell.metric("e2e_ms.p95")),
                fmt(cell.metric("requests.failed"), 0),
                slo_text,
                tail,
            ]
        )
        flags.append("failed" if cell.status == "failed" else ("limited" if cell.client_limited else ""))
    return Table("Per-cell details (latencies in ms)", columns, rows, flags)


def _rate_cell(rate: float | None, good: int, judged: int) -> str:
    return "—" if not judged or rate is None else f"{rate * 100:.1f}% ({good}/{judged})"


def _rate_slo_text(cell: CellOutcome) -> str:
    features = cell.summary.features if cell.summary is not None else None
    if features is None or not features.slo:
        return "—"
    missed = [name for name, check in features.slo.items() if not check.met]
    return "met" if not missed else "missed " + ", ".join(missed)


def features_table(results: SweepResults) -> Table | None:
    """The feature workloads of every cell that ran them: valid rates, invalid-answer kinds, reasoning timings.

    None when no cell ran `--features` (the report then has no such section).
    """
    columns = [
        "deployment",
        "cell",
        "features",
        "schema-valid",
        "valid tool calls",
        "invalid answers",
        "reasoning tok p50",
        "answer tok p50",
        "first reasoning p50 ms",
        "first answer p50 ms",
        "first answer p95 ms",
        "rate SLO",
    ]
    rows: list[list[str]] = []
    flags: list[str] = []
    for cell in results.cells:
        features = cell.summary.features if cell.summary is not None else None
        if features is None:
            continue
        reasons = "; ".join(f"{count} {kind}" for kind, count in features.invalid_reasons.items()) or "—"
        rows.append(
            [
                cell.deployment,
                cell.cell,
                ", ".join(features.requested),
                _rate_cell(features.schema_valid_rate, features.schema_valid, features.structured_requests),
                _rate_cell(features.tool_call_valid_rate, features.tool_calls_valid, features.tool_calls_judged),
                reasons,
                fmt(features.reasoning_tokens.p50, 0) if features.thinking_requests else "—",
                fmt(features.answer_tokens.p50, 0) if features.thinking_requests else "—",
                fmt(features.time_to_first_reasoning_ms.p50),
                fmt(features.time_to_first_answer_ms.p50),
                fmt(features.time_to_first_answer_ms.p95),
                _rate_slo_text(cell),
            ]
        )
        flags.append("failed" if features.slo_met is False else "")
    if not rows:
        return None
    return Table("Feature workloads: valid answers and reasoning (docs/metrics.md)", columns, rows, flags)


def knee_sentences(results: SweepResults) -> list[str]:
    return [knee.sentence() for knee in find_knees(results)]
