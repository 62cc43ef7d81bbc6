"""The console's per-request-type table and TTFT breakdown: "where does my image request's time go".

Kept apart from bench.console (one run's headline report) because it reads only the `by_type`
block and the engine histograms' breakdown, and prints nothing for a plain text run without them.
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console
from rich.table import Table

from vlmserve.results.blocks import ServerBlock
from vlmserve.results.summary import RunSummary, TypeSummary


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _rows(summary: RunSummary) -> Iterator[tuple[str, TypeSummary]]:
    """Each type, then its first-sight and repeat splits."""
    for name, block in (summary.by_type or {}).items():
        yield name, block
        for split, part in (block.by_repeat or {}).items():
            yield f"  {name} · {split}", part


def _slo_cell(block: TypeSummary) -> str:
    good = block.goodput
    if good is None:
        return "-"
    missed = [key for key, check in good.checks.items() if not check.met]
    verdict = "met" if not missed else "missed " + ", ".join(missed)
    return f"{verdict} ({good.fraction * 100:.0f}% good)"


def worth_printing(summary: RunSummary) -> bool:
    """More than one type, a non-text type, engine timings or a per-type SLO: otherwise the headline says it all."""
    blocks = summary.by_type or {}
    return len(blocks) > 1 or any(
        name != "text" or block.goodput is not None or (block.breakdown is not None and block.breakdown.source == "engine spans")
        for name, block in blocks.items()
    )


def type_table(summary: RunSummary) -> Table:
    table = Table(title="per request type (ms)", show_edge=False)
    for column in ("type", "requests", "failed", "body KiB", "TTFT p50", "TTFT p95", "TPOT p50", "E2E p95", "SLO"):
        table.add_column(column, justify="left" if column in ("type", "SLO") else "right")
    for name, block in _rows(summary):
        size = None if block.request_bytes_mean is None else block.request_bytes_mean / 1024
        table.add_row(
            name,
            str(block.requests),
            str(block.failed),
            _ms(size),
            _ms(block.ttft_ms.p50),
            _ms(block.ttft_ms.p95),
            _ms(block.tpot_ms.p50, 2),
            _ms(block.e2e_ms.p95),
            _slo_cell(block),
        )
    return table


def breakdown_table(summary: RunSummary) -> Table:
    """Mean parts of TTFT per type; the columns add up to the client's TTFT."""
    table = Table(title="where TTFT goes (mean ms; upload + frontend + queue + prefill = TTFT)", show_edge=False)
    for column in ("type", "TTFT", "upload", "frontend", "(http", "engine)", "queue", "prefill", "accounted", "covers"):
        table.add_column(column, justify="left" if column == "type" else "right")
    for name, block in _rows(summary):
        parts = block.breakdown
        if parts is None:
            table.add_row(name, *(["-"] * 9))
            continue
        engine = parts.source == "engine spans"
        accounted = "-" if parts.accounted is None else f"{parts.accounted * 100:.0f}%"
        covers = f"{parts.requests} req" + ("" if engine else " (client only)")
        frontend = parts.frontend_ms if engine else parts.after_upload_ms
        table.add_row(
            name,
            _ms(parts.client_ttft_ms),
            _ms(parts.upload_ms, 2),
            _ms(frontend),
            _ms(parts.http_ms),
            _ms(parts.engine_frontend_ms),
            _ms(parts.queue_ms),
            _ms(parts.prefill_ms),
            accounted,
            covers,
        )
    return table


def engine_line(server: ServerBlock | None) -> str | None:
    """The run-level breakdown from the engine's histograms, and the multimodal cache hit rate."""
    if server is None:
        return None
    block = server.engine_breakdown
    rate = server.mm_cache_hit_rate
    if not block and rate is None:
        return None
    parts = []
    if block:
        parts.append(
            f"TTFT {_ms(block.ttft_ms)} ms = frontend {_ms(block.frontend_ms)} + queue "
            f"{_ms(block.queue_ms)} + prefill {_ms(block.prefill_ms)} (mean of {block.requests} requests)"
        )
    if rate is not None:
        parts.append(f"multimodal cache hit rate {rate * 100:.1f}%")
    return "engine (its /metrics histograms): " + "; ".join(parts)


def print_types(console: Console, summary: RunSummary) -> None:
    """The per-type table and the breakdown, and the engine's own run-level breakdown."""
    line = engine_line(summary.server)
    if line:
        console.print(line)
    if not worth_printing(summary):
        return
    console.print(type_table(summary))
    console.print(breakdown_table(summary))
    if not any(block.breakdown is not None and block.breakdown.source == "engine spans" for _, block in _rows(summary)):
        console.print(
            "breakdown: client side only; --engine-traces HOST:PORT (engine started with "
            "--otlp-traces-endpoint http://HOST:PORT/v1/traces) splits the rest into frontend, queue and prefill"
        )
