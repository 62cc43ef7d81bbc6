"""The console's per-adapter table (`bench --lora-adapters`): latencies and the first-use penalty of each adapter."""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table

from vlmserve.results.summary import RunSummary

MAX_ROWS = 20
"""Adapters shown (the most requested first); the rest are summed up in one line."""


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_adapters(console: Console, summary: RunSummary) -> None:
    """One row per adapter (most requested first), then the median first-use penalty over the adapters."""
    blocks = summary.by_adapter
    if not blocks:
        return
    table = Table(title="per LoRA adapter (ms)", show_edge=False)
    for column in ("adapter", "share", "requests", "failed", "TTFT p50", "TTFT p95", "TPOT p50", "first use", "penalty"):
        table.add_column(column, justify="left" if column == "adapter" else "right")
    for name, block in list(blocks.items())[:MAX_ROWS]:
        table.add_row(
            name,
            f"{block.share * 100:.1f}%",
            str(block.requests),
            str(block.failed),
            _ms(block.ttft_ms.p50),
            _ms(block.ttft_ms.p95),
            _ms(block.tpot_ms.p50, 2),
            _ms(block.first_use_ttft_ms),
            _ms(block.first_use_penalty_ms),
        )
    console.print(table)
    if len(blocks) > MAX_ROWS:
        console.print(f"  ... and {len(blocks) - MAX_ROWS} more adapters (all in the JSON summary's by_adapter)")
    penalties = [block.first_use_penalty_ms for block in blocks.values() if block.first_use_penalty_ms is not None]
    if penalties:
        console.print(
            f"first-use penalty (first request's TTFT - the adapter's later p50): median "
            f"{statistics.median(penalties):,.1f} ms over {len(penalties)} adapters"
        )
