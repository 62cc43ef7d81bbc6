"""What a person sees: a live progress line with running figures, then a summary table."""

from __future__ import annotations

import time
from collections import deque
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vlmserve.bench.console_adapters import print_adapters
from vlmserve.bench.console_features import print_features
from vlmserve.bench.console_scaling import print_scaling
from vlmserve.bench.console_types import print_types
from vlmserve.results.blocks import ClientBlock, PrefixCacheBlock, RepeatsBlock, ServerBlock
from vlmserve.results.records import RequestRecord
from vlmserve.results.summary import DISTRIBUTION_STATS, LATENCY_METRICS, GroupSummary, RunSummary, SloCheck, TokenCounts


class LiveProgress:
    """Rich progress bar fed one record at a time; shows ok/failed, req/s, tok/s, recent TTFT."""

    def __init__(self, console: Console, total: int | None, duration_s: float | None, enabled: bool = True) -> None:
        self.enabled = enabled
        self.console = console
        self.total = total
        self.duration_s = duration_s
        self.ok = 0
        self.failed = 0
        self.tokens = 0
        self.recent_ttft: deque[float] = deque(maxlen=200)
        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("[bold]bench"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("starting", total=total if total else duration_s)
        self.live: Live | None = None

    def __enter__(self) -> "LiveProgress":
        if self.enabled:
            self.live = Live(self.progress, console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None) -> None:
        if self.live is not None:
            self.live.__exit__(exc_type, exc, traceback)

    def start_clock(self) -> None:
        self.started = time.monotonic()

    def add(self, record: RequestRecord, _text: str | None = None) -> None:
        if record.ok:
            self.ok += 1
            self.tokens += record.output_tokens or 0
            if record.ttft_s is not None:
                self.recent_ttft.append(record.ttft_s)
        else:
            self.failed += 1
        if self.enabled:
            self._render()

    def _render(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        ttft = sorted(self.recent_ttft)
        median = f"{ttft[len(ttft) // 2] * 1000:.0f} ms" if ttft else "-"
        description = (
            f"ok {self.ok} failed {self.failed} | {self.ok / elapsed:.1f} req/s "
            f"{self.tokens / elapsed:.0f} tok/s | TTFT p50 {median}"
        )
        done = self.ok + self.failed if self.total else min(elapsed, self.duration_s or elapsed)
        self.progress.update(self.task, completed=done, description=description)


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _known(value: object, digits: int = 1) -> str:
    """Like `_fmt`, but a missing value reads 'unknown' (in prose, '-' would read as a dash)."""
    return "unknown" if value is None else _fmt(value, digits)


def _pct(value: float | None) -> str:
    """A fraction as a percentage, or 'unknown': a missing figure must never read as 0 %."""
    return "unknown" if value is None else f"{value * 100:,.1f}%"


def slo_verdict(key: str, check: SloCheck) -> str:
    """'ttft_p95 47.7 ms > 40 ms: missed' (or '≤ …: met'); the unit and the verdict in words."""
    if check.measured_ms is None:
        return f"{key} not measured (bound {check.bound_ms:g} ms): missed"
    relation = "≤" if check.met else ">"
    return f"{key} {check.measured_ms:,.1f} ms {relation} {check.bound_ms:g} ms: {'met' if check.met else 'missed'}"


_INTERVAL_LABELS = {
    "throughput.requests_per_s": ("req/s", ""),
    "throughput.output_tokens_per_s": ("output tok/s", ""),
    "ttft_ms.p50": ("TTFT p50", " ms"),
    "ttft_ms.p95": ("TTFT p95", " ms"),
    "tpot_ms.p50": ("TPOT p50", " ms"),
    "tpot_ms.p95": ("TPOT p95", " ms"),
}


def repeats_line(repeats: RepeatsBlock | None) -> str:
    """'single run: no confidence interval …' or '95% CI over 3 repeats: TTFT p50 33.1 ± 1.2 ms, …'."""
    if repeats is None or repeats.single_run:
        return "single run: no confidence interval (--repeat N runs the load N times and gives one)"
    intervals = repeats.intervals or {}
    parts = [
        f"{label} {intervals[path].mean:,.2f} ± {_fmt(intervals[path].half_width, 2)}{unit}"
        for path, (label, unit) in _INTERVAL_LABELS.items()
        if path in intervals
    ]
    return f"mean and 95% CI over {repeats.count} repeats (student t): " + ", ".join(parts)


def summary_table(summary: RunSummary) -> Table:
    """Latency distributions as rows, the percentiles as columns."""
    table = Table(title="latency (ms)", show_edge=False)
    table.add_column("metric")
    for column in DISTRIBUTION_STATS:
        table.add_column(column, justify="right")
    for key in LATENCY_METRICS:
        block = summary.latency(key)
        table.add_row(key.removesuffix("_ms").upper(), *(_fmt(block.stat(column), 2) for column in DISTRIBUTION_STATS))
    return table


def print_summary(console: Console, summary: RunSummary) -> None:
    """The console report of one run."""
    _print_header(console, summary)
    console.print(summary_table(summary))
    console.print(repeats_line(summary.repeats))
    if summary.scaling is not None:
        print_scaling(console, summary.scaling, simulated=summary.meta.simulated)
    _print_tokens(console, summary.tokens)
    good = summary.goodput
    if good is not None:
        checks = ", ".join(slo_verdict(key, check) for key, check in good.checks.items())
        console.print(
            f"goodput: {good.requests_per_s:.2f} req/s, {good.fraction * 100:.1f}% of requests met every SLO ({checks})"
        )
    print_features(console, summary)
    _print_client(console, summary.client)
    _print_server(console, summary.server, summary.prefix_cache)
    print_types(console, summary)
    print_adapters(console, summary)
    for warning in summary.warnings or []:
        console.print(f"[bold yellow]warning: {warning}[/]")
    if summary.per_turn:
        console.print(_per_turn_table(summary.per_turn))


def _print_header(console: Console, summary: RunSummary) -> None:
    """Which run, against what; its requests, how it ended, and its throughput."""
    meta = summary.meta
    requests = summary.requests
    throughput = summary.throughput
    console.print(
        f"[bold]run {meta.run_id or '(not stored)'}[/] {meta.label or ''} → {meta.target} "
        f"model {meta.model} ({meta.server_version or 'unknown version'})"
        + (" [bold yellow]SIMULATED (sim engine or planner, not measured on hardware)[/]" if meta.simulated else "")
    )
    causes = ", ".join(f"{n} {cause}" for cause, n in requests.failed_by_cause.items())
    console.print(
        f"requests: {requests.completed} ok, {requests.failed} failed{f' ({causes})' if causes else ''}"
        f" in {summary.duration_s:.2f} s"
        + (" [bold yellow](INTERRUPTED: stopped by Ctrl-C)[/]" if meta.interrupted else "")
        + (f" [bold yellow](stopped: {meta.stopped})[/]" if meta.stopped else "")
    )
    if meta.stopped_reason:
        console.print(f"[bold yellow]stopped early: {meta.stopped_reason}; the figures cover the run until then[/]")
    console.print(
        f"throughput: {throughput.requests_per_s:.2f} req/s, {throughput.output_tokens_per_s:.1f} output tok/s, "
        f"{throughput.total_tokens_per_s:.1f} total tok/s, {throughput.chunks_per_s:.1f} chunks/s"
    )


def _print_tokens(console: Console, tokens: TokenCounts) -> None:
    """Requested vs actual lengths, and a warning when usage and the tokenizer disagree."""
    console.print(
        f"tokens: prompt {_fmt(tokens.actual_prompt_mean)} mean (requested {_fmt(tokens.requested_prompt_mean)}), "
        f"output {_fmt(tokens.actual_output_mean)} mean (requested {_fmt(tokens.requested_output_mean)})"
        + (f", reasoning {tokens.reasoning_total}" if tokens.reasoning_total else "")
        + (f", tool calls {tokens.tool_calls_total}" if tokens.tool_calls_total else "")
        + (f", images {tokens.images_total}" if tokens.images_total else "")
    )
    if tokens.usage_tokenizer_disagree:
        console.print(
            f"[yellow]warning: usage and tokenizer disagree on output tokens for "
            f"{tokens.usage_tokenizer_disagreements} of {tokens.tokenizer_checked} checked requests[/]"
        )


def _print_client(console: Console, client: ClientBlock) -> None:
    """Offered vs sent rate, send lag and CPU, and the CLIENT-LIMITED verdict."""
    lag = client.send_lag_ms
    cpu = client.cpu
    busiest = max(cpu.worker_busy_fraction.values(), default=None) if cpu is not None else None
    console.print(
        f"client: offered {_fmt(client.offered_rate)} req/s, sent {_fmt(client.achieved_send_rate)} req/s, "
        f"send lag p50 {_fmt(lag.p50, 2)} p99 {_fmt(lag.p99, 2)} ms, "
        f"{cpu.processes if cpu is not None else 0} process(es), "
        f"busiest {_fmt(busiest * 100 if busiest is not None else None, 0)}% CPU"
    )
    if client.limited:
        console.print(
            f"[bold red]CLIENT-LIMITED: {'; '.join(client.limited_reasons)} — these figures measure the client, not the server[/]"
        )


def _print_server(console: Console, server: ServerBlock | None, cache: PrefixCacheBlock | None) -> None:
    """The server's counters over the run, with the prefix-cache hit rate the workload intended."""
    if server is None or not server.available:
        console.print("server: no /metrics at the target; prefix-cache hit rate, KV usage and preemptions unknown")
        return
    if server.engines_unknown:  # a gateway whose engines' page could not be read
        console.print(f"server: {server.engines_unknown}; prefix-cache hit rate, KV usage and preemptions unknown")
        return
    intended = f" (intended {_pct(cache.expected_hit_rate)} for {cache.workload})" if cache and cache.workload else ""
    console.print(
        f"server: prefix-cache hit rate {_pct(server.prefix_cache_hit_rate)}{intended}, "
        f"preemptions {_known(server.preemptions, 0)}, "
        f"peak running {_known(server.peak_running, 0)}, peak waiting {_known(server.peak_waiting, 0)}, "
        f"peak KV usage {_pct(server.peak_kv_cache_usage)}"
    )


def _per_turn_table(per_turn: dict[str, GroupSummary]) -> Table:
    """Counts and latencies per turn of a multi-turn run."""
    table = Table(title="per turn", show_edge=False)
    for column in ("turn", "requests", "failed", "TTFT p50", "TTFT p99", "E2E p50", "prompt tokens"):
        table.add_column(column, justify="right")
    for turn, block in per_turn.items():
        table.add_row(
            turn,
            str(block.requests),
            str(block.failed),
            _fmt(block.ttft_ms.p50),
            _fmt(block.ttft_ms.p99),
            _fmt(block.e2e_ms.p50),
            _fmt(block.mean_prompt_tokens, 0),
        )
    return table
