"""The end-of-job summary: counts, failures by cause, tokens, and cost when priced."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from vlmserve.batch.output import BatchOutcome


@dataclass(frozen=True)
class Pricing:
    """What the GPUs behind the endpoint cost while this run used them."""

    price_per_gpu_hour: float
    gpus: int = 1

    def run_cost(self, elapsed_s: float) -> float:
        return self.price_per_gpu_hour * self.gpus * elapsed_s / 3600.0


def summary_rows(outcome: BatchOutcome, pricing: Pricing | None) -> list[tuple[str, str]]:
    """(label, value) rows; kept separate from printing so tests can read them."""
    rows = [
        ("lines in input", f"{outcome.entries:,}"),
        ("answered by earlier runs", f"{outcome.answered_before:,}"),
        ("answered by this run", f"{outcome.answered_now:,} in {outcome.elapsed_s:,.1f} s"),
        ("succeeded (whole job)", f"{outcome.succeeded:,}"),
        ("failed (whole job)", f"{outcome.failed:,}"),
    ]
    rows += [(f"  failed: {cause}", f"{count:,}") for cause, count in sorted(outcome.failed_by_cause.items())]
    if outcome.no_answer:
        rows.append(("no answer (will be resent on rerun)", f"{outcome.no_answer:,}"))
    if outcome.remaining:
        rows.append(("not answered yet", f"{outcome.remaining:,}"))
    rows += [
        ("retries", f"{outcome.retries:,}"),
        ("prompt tokens (whole job)", f"{outcome.prompt_tokens:,}"),
        ("completion tokens (whole job)", f"{outcome.completion_tokens:,}"),
    ]
    if outcome.elapsed_s > 0:
        rows.append(("completion tokens/s (this run)", f"{outcome.run_completion_tokens / outcome.elapsed_s:,.1f}"))
    if pricing is not None:
        cost = pricing.run_cost(outcome.elapsed_s)
        rows.append((f"cost of this run ({pricing.gpus} GPU x ${pricing.price_per_gpu_hour:g}/h)", f"${cost:,.4f}"))
        if outcome.run_completion_tokens:
            rows.append(("cost per 1M completion tokens", f"${cost / outcome.run_completion_tokens * 1e6:,.4f}"))
    return rows


def print_summary(console: Console, outcome: BatchOutcome, pricing: Pricing | None) -> None:
    table = Table(title="batch summary", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for label, value in summary_rows(outcome, pricing):
        table.add_row(label, value)
    console.print(table)
