"""The HTML report's per-adapter table (`bench --lora-adapters`): each cell's adapters, latencies, first-use penalty."""

from __future__ import annotations

from vlmserve.report.tables import Table, fmt
from vlmserve.sweep.results import SweepResults

MAX_ADAPTER_ROWS = 64
"""Adapters listed per cell (the most requested first); the JSON summary has them all."""


def adapters_table(results: SweepResults) -> Table | None:
    """One row per adapter of every cell that ran --lora-adapters; None when none did."""
    columns = [
        "deployment",
        "cell",
        "adapter",
        "share",
        "requests",
        "failed",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "TPOT p50 ms",
        "first use TTFT ms",
        "first-use penalty ms",
    ]
    rows: list[list[str]] = []
    for cell in results.cells:
        blocks = cell.summary.by_adapter if cell.summary is not None else None
        for name, block in list((blocks or {}).items())[:MAX_ADAPTER_ROWS]:
            rows.append(
                [
                    cell.deployment,
                    cell.cell,
                    name,
                    f"{block.share * 100:.1f}%",
                    str(block.requests),
                    str(block.failed),
                    fmt(block.ttft_ms.p50),
                    fmt(block.ttft_ms.p95),
                    fmt(block.tpot_ms.p50, 2),
                    fmt(block.first_use_ttft_ms),
                    fmt(block.first_use_penalty_ms),
                ]
            )
    if not rows:
        return None
    return Table("LoRA adapters: latency and first-use penalty per adapter (docs/lora.md)", columns, rows, [""] * len(rows))
