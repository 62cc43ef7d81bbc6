"""The console's feature-workload report: valid rates, why answers were invalid, reasoning timings.

Reads only the summary's `features` block (results.features defines every figure) and prints
nothing for a run without `--features`.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vlmserve.results.summary import Distribution, FeatureSummary, RateCheck, RunSummary

_STATS = ("p50", "p90", "p99", "mean")


def _pct(value: float | None) -> str:
    return "not measured" if value is None else f"{value * 100:.1f}%"


def rate_verdict(name: str, check: RateCheck) -> str:
    """'schema_valid 97.0% < 99.0%: missed' (or '≥ …: met')."""
    if check.measured is None:
        return f"{name} not measured (bound ≥ {check.bound * 100:.1f}%): missed"
    relation = "≥" if check.met else "<"
    return f"{name} {check.measured * 100:.1f}% {relation} {check.bound * 100:.1f}%: {'met' if check.met else 'missed'}"


def _row(label: str, block: Distribution, digits: int) -> list[str]:
    return [label, str(block.count), *("-" if block.stat(stat) is None else f"{block.stat(stat):,.{digits}f}" for stat in _STATS)]


def rate_lines(features: FeatureSummary) -> list[str]:
    """One line per judged feature: the rate, its counts, and the most frequent reasons for invalid answers."""
    lines: list[str] = []
    if features.structured_requests:
        lines.append(
            f"schema-valid rate: {_pct(features.schema_valid_rate)} "
            f"({features.schema_valid} of {features.structured_requests} structured answers)"
        )
    if features.tool_requests:
        choices = "/".join(features.tool_choices) or "-"
        lines.append(
            f"valid tool-call rate: {_pct(features.tool_call_valid_rate)} ({features.tool_calls_valid} of "
            f"{features.tool_calls_judged} judged; tool_choice {choices}; "
            f"{features.answered_without_tool_call} answered without a call)"
        )
    if features.invalid_reasons:
        lines.append("invalid answers: " + ", ".join(f"{count} {kind}" for kind, count in features.invalid_reasons.items()))
    return lines


def reasoning_table(features: FeatureSummary) -> Table:
    """Reasoning and answer tokens, time to first reasoning and first answer token, as rows."""
    table = Table(
        title=f"thinking ({features.requests_with_reasoning} of {features.thinking_requests} requests reasoned)", show_edge=False
    )
    table.add_column("figure")
    table.add_column("n", justify="right")
    for stat in _STATS:
        table.add_column(stat, justify="right")
    table.add_row(*_row("reasoning tokens", features.reasoning_tokens, 1))
    table.add_row(*_row("answer tokens", features.answer_tokens, 1))
    table.add_row(*_row("first reasoning token (ms)", features.time_to_first_reasoning_ms, 1))
    table.add_row(*_row("first answer token (ms)", features.time_to_first_answer_ms, 1))
    return table


def print_features(console: Console, summary: RunSummary) -> None:
    """The feature block of one run's console report (nothing without `--features`)."""
    features = summary.features
    if features is None:
        return
    console.print(f"[bold]features: {', '.join(features.requested)}[/]")
    for line in rate_lines(features):
        console.print(line)
    if features.thinking_requests:
        console.print(reasoning_table(features))
    if features.slo:
        verdicts = ", ".join(rate_verdict(name, check) for name, check in features.slo.items())
        console.print(f"feature SLOs {'met' if features.slo_met else 'MISSED'}: {verdicts}")
