"""run_load: one bench run from a LoadSpec and a Target to a RunResult.

Order matters: the target is checked before anything is prepared (a wrong URL fails in
a second), requests are fully prepared before the clock starts (so building prompts never
delays a send), the server is scraped around the load, and figures come only from
`metrics.summarize`.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone

from rich.console import Console

from vlmserve.bench.adapters import assign_adapters
from vlmserve.bench.client import RequestOptions
from vlmserve.bench.clientcpu import ClientCpuMonitor
from vlmserve.bench.console import LiveProgress
from vlmserve.bench.engine_traces import TraceReceiver, attach_engine_timings, parse_listen_address
from vlmserve.bench.features.assign import assign_features
from vlmserve.bench.features.check import check_answers
from vlmserve.bench.features.request import FIXED_ANSWER_FEATURES
from vlmserve.bench.interrupt import GRACE_S, Interrupt, ctrl_c_stops_load
from vlmserve.bench.load import LoadOutcome, WorkerPlan, WorkItem, arrival_offsets, build_item_bodies, run_workers, workers_needed
from vlmserve.bench.load_shapes import parse_load_shape
from vlmserve.bench.post_run import PostRunWarnings
from vlmserve.bench.prefix_cache import prefix_cache_block, prefix_cache_warnings
from vlmserve.bench.saturation import OVERSATURATED, OversaturationDetector, SaturationRule, watch
from vlmserve.bench.scrape import ServerScraper
from vlmserve.bench.target import ServerFacts, Target, check_target
from vlmserve.bench.tokens import TokenCounter, choose_counter
from vlmserve.bench.workloads import Conversation, WorkloadContext, build_conversations, check_local_inputs
from vlmserve.json_types import JSONObject
from vlmserve.results import metrics, store
from vlmserve.results.blocks import ClientCpu, EngineTraces, RunMeta, ServerBlock
from vlmserve.results.records import RequestRecord
from vlmserve.results.run import RunResult
from vlmserve.spec import SLO, LoadSpec

__all__ = ["Target", "run_load", "RunResult"]

DURATION_POOL_MAX = 2000
"""Conversations prepared for a duration-bounded run. Sent again, each is reshuffled into an
unseen variant at send time (`fresh_variant`), unless the load asks for a prompt pool."""

SPAN_WAIT_S = 10.0
"""After the load, how long to wait for the engine's last spans (vLLM exports every
OTEL_BSP_SCHEDULE_DELAY, 5 s by default); the wait ends as soon as every answered request has its span."""

TOKENIZER_CHECK_MAX = 1000
"""Answers re-counted with the tokenizer (a sample when there are more)."""


def _conversations_needed(load: LoadSpec) -> int:
    """Conversations to prepare: every request's, a duration run's base set, or the prompt pool."""
    if load.num_requests is not None:
        needed = load.num_requests + load.warmup
    else:
        assert load.duration_s is not None
        if load.load_shape is not None:
            expected = parse_load_shape(load.load_shape).expected_requests
            needed = min(DURATION_POOL_MAX, int(expected * 1.1) + load.warmup + 1)
        elif load.rate is not None:
            needed = min(DURATION_POOL_MAX, int(load.rate * load.duration_s * 1.1) + load.warmup + 1)
        else:
            needed = min(DURATION_POOL_MAX, max((load.concurrency or 1) * 8, 64) + load.warmup)
    return min(needed, load.prompt_pool_size) if load.prompt_pool_size else needed


def _trim_to_requests(conversations: list[Conversation], requests: int) -> list[Conversation]:
    """The first conversations whose turns add up to exactly `requests` (the last one cut short)."""
    trimmed: list[Conversation] = []
    remaining = requests
    for conversation in conversations:
        if remaining <= 0:
            break
        if len(conversation.turns) > remaining:
            conversation = Conversation(
                conversation.conversation_id,
                conversation.workload,
                conversation.turns[:remaining],
                conversation.system,
                conversation.arrival_s,
            )
        trimmed.append(conversation)
        remaining -= len(conversation.turns)
    return trimmed


def _plans(
    load: LoadSpec, target: Target, options: RequestOptions, conversations: list[Conversation], workers: int, *, keep_text: bool
) -> list[WorkerPlan]:
    """Split the load over `workers`: users and budgets for a closed loop, send offsets for an open one."""
    url = f"{target.base_url}{options.path}"
    rng = random.Random(load.seed + 1)
    closed = load.concurrency is not None
    items = [WorkItem(c, build_item_bodies(c, options, load.multi_turn)) for c in conversations]
    if not closed:
        if load.load_shape is not None:
            offsets = parse_load_shape(load.load_shape).arrival_offsets(load.arrival, load.burstiness, rng)
        elif load.dataset == "trace" and load.rate is None:
            offsets = [c.arrival_s or 0.0 for c in conversations]
        else:
            assert load.rate is not None
            total = len(items) if load.num_requests is not None else None
            if load.num_requests is not None and load.prompt_pool_size:
                total = load.num_requests + load.warmup  # a pool: conversations are sent more than once
            offsets = arrival_offsets(load.arrival, load.rate, load.burstiness, rng, count=total, duration_s=load.duration_s)
        if len(offsets) > len(items):  # send the prepared ones again: as fresh variants, or as is from a pool
            base = items
            items = [
                WorkItem(base[i % len(base)].conversation, base[i % len(base)].bodies, variant=i // len(base))
                for i in range(len(offsets))
            ]
        turns_seen = 0
        for item, offset in zip(items, offsets):
            item.offset_s = offset
            item.warmup = turns_seen < load.warmup
            turns_seen += len(item.conversation.turns)
        items = items[: len(offsets)]
    plans: list[WorkerPlan] = []
    clock_offset = time.time() - time.perf_counter()
    for index in range(workers):
        share = items[index::workers]
        if closed and not share and items:  # a prompt pool smaller than the workers: users still need prompts
            share = [items[index % len(items)]]
        plan = WorkerPlan(
            index=index,
            url=url,
            headers=target.headers,
            options=options,
            items=share,
            duration_s=load.duration_s if load.num_requests is None else None,
            multi_turn=load.multi_turn,
            timeout_s=load.request_timeout_s,
            keep_text=keep_text,
            clock_offset=clock_offset,
            fresh_seed=None if load.prompt_pool_size else load.seed,
        )
        if closed:
            assert load.concurrency is not None
            plan.users = load.concurrency // workers + (1 if index < load.concurrency % workers else 0)
            if load.num_requests is not None:
                total = load.num_requests + load.warmup
                plan.max_requests = total // workers + (1 if index < total % workers else 0)
            plan.warmup_requests = load.warmup // workers + (1 if index < load.warmup % workers else 0)
            if plan.users == 0:
                continue
        plans.append(plan)
    return plans


def oversaturation_detector(load: LoadSpec, plans: list[WorkerPlan]) -> OversaturationDetector | None:
    """The over-saturation stop for an open loop that asks for it (None: not judged)."""
    if not load.stop_when_oversaturated or load.concurrency is not None:
        return None
    offsets = sorted(item.offset_s for plan in plans for item in plan.items if item.offset_s is not None)
    if not offsets:
        return None
    expected = load.duration_s if load.duration_s is not None else offsets[-1]
    return OversaturationDetector(SaturationRule.for_duration(expected), offsets)


def _tokenizer_check(records: list[RequestRecord], texts: dict[str, str], counter: TokenCounter, seed: int) -> None:
    """Count answers with the tokenizer so usage can be checked against it (a sample if many).

    All or nothing: a failure part-way (the server gone) raises and leaves every record as it was.
    """
    if not counter.exact or not texts:
        return
    # the kept text is the answer's content: only when it is the whole output can it check usage
    # (reasoning and tool-call tokens are billed in usage but are not in it; an empty text has nothing to count)
    candidates = [
        record
        for record in records
        if record.ok and texts.get(record.request_id) and not record.reasoning_tokens and not record.tool_calls
    ]
    if len(candidates) > TOKENIZER_CHECK_MAX:
        candidates = random.Random(seed).sample(candidates, TOKENIZER_CHECK_MAX)
    counts = [counter.count_text(texts[record.request_id]) for record in candidates]
    for record, count in zip(candidates, counts):
        record.tokenizer_output_tokens = count


@dataclass
class _Prepared:
    """Everything ready before the clock starts: the server's facts, the counter, the worker plans."""

    options: RequestOptions
    facts: ServerFacts
    counter: TokenCounter
    notices: list[str]
    plans: list[WorkerPlan]
    in_process: bool


@dataclass
class _Driven:
    """What the load phase left: its outcome, the client's CPU, and why it stopped early (if it did)."""

    outcome: LoadOutcome
    cpu: ClientCpu
    stopped: list[str]


async def run_load(
    load: LoadSpec,
    target: Target,
    *,
    slo: SLO | None = None,
    progress: bool = True,
    label: str | None = None,
    deployment: JSONObject | None = None,
    console: Console | None = None,
    client_limits: metrics.ClientLimits = metrics.ClientLimits(),
    stop_on_ctrl_c: bool = False,
    server_metrics_interval_s: float = 1.0,
    engine_traces: str | None = None,
) -> RunResult:
    """Check the target, prepare every request, drive the load, scrape the server, summarise.

    With `stop_on_ctrl_c` (the CLI), Ctrl-C during the load stops it but still gives a
    result: every record so far, summarised and marked `interrupted` in the meta.
    With `engine_traces` (HOST:PORT) an OTLP receiver listens there during the run, every
    request carries its own traceparent, and the engine's spans fill each record's engine timings.
    """
    receiver = TraceReceiver(*parse_listen_address(engine_traces)) if engine_traces is not None else None
    console = console or Console(stderr=True)
    prepared = await _prepare(load, target, console, progress, trace_requests=receiver is not None)
    started_at = datetime.now(timezone.utc)
    scraper = ServerScraper(target.base_url, target.headers, interval_s=server_metrics_interval_s)
    if receiver is not None:
        await receiver.start()
    await scraper.start()
    try:
        driven = await _drive(load, prepared, console, progress, stop_on_ctrl_c)
    except BaseException:
        if receiver is not None:  # the run failed: no spans to wait for, the port is freed
            await receiver.stop()
        raise
    if driven.stopped:
        console.print(f"[bold yellow]stopped early: {driven.stopped[0]}[/]")
    # From here on the records are the run: a failing step is a warning, never a lost run.
    warnings = PostRunWarnings()
    server = await _last_scrape(scraper, warnings)
    records = sorted(driven.outcome.records, key=lambda record: record.sent_at_s)
    for record in records:
        record.simulated = prepared.facts.simulated
    traces = await _collect_engine_spans(receiver, records, warnings) if receiver is not None else None
    await _check_records(records, driven.outcome.texts, prepared.counter, load.seed, warnings)
    summary = metrics.summarize(records, slo)
    summary.client = metrics.judge_client(
        summary.client.model_copy(update={"cpu": driven.cpu, "workers": len(prepared.plans), "in_process": prepared.in_process}),
        client_limits,
        open_loop=load.concurrency is None,
    )
    summary.server = server
    summary.prefix_cache = prefix_cache_block(load, server, len(records))
    summary.warnings = warnings.messages + prefix_cache_warnings(summary.prefix_cache)
    summary.meta = RunMeta(
        run_id=store.new_run_id(started_at),
        label=label,
        target=target.base_url,
        model=target.model,
        server_version=prepared.facts.server_version,
        load_spec=load.model_dump(mode="json"),
        deployment=deployment,
        started_at=started_at.isoformat(),
        simulated=prepared.facts.simulated,
        post_run_failed=bool(warnings.messages),
        token_counter=prepared.counter.source,
        prompt_lengths_exact=prepared.counter.exact,
        per_chunk_usage=prepared.facts.per_chunk_usage,
        notices=prepared.notices,
        slo=slo.bounds_s if slo else None,
        slo_by_type=slo.by_type if slo and slo.by_type else None,
        slo_rates=slo.min_rates if slo and slo.min_rates else None,
        client_limited=summary.client_limited,
        interrupted=driven.outcome.interrupted and not driven.stopped,
        stopped=OVERSATURATED if driven.stopped else None,
        stopped_reason=driven.stopped[0] if driven.stopped else None,
        host_cpus=os.cpu_count(),
        engine_traces=traces,
    )
    return RunResult(records=records, summary=summary)


async def _prepare(load: LoadSpec, target: Target, console: Console, progress: bool, *, trace_requests: bool) -> _Prepared:
    """Check the target and build every request and the worker plans before the clock starts."""
    options = RequestOptions(
        api=load.api,
        model=target.model,
        ignore_eos=load.ignore_eos,
        extra_body=dict(load.extra_body or {}),
        mm_processor_kwargs=load.mm_processor_kwargs,
        per_chunk_usage=load.per_chunk_usage,
    )
    check_local_inputs(load)  # a missing file is the user's to fix first, whatever the server says
    facts = await asyncio.to_thread(check_target, target, options)
    options.per_chunk_usage = facts.per_chunk_usage

    counter = await asyncio.to_thread(choose_counter, load.tokenizer, target.base_url, target.model, target.headers)
    context = WorkloadContext(load=load, counter=counter, rng=random.Random(load.seed))
    with console.status("preparing requests", spinner="dots") if progress else nullcontext():
        conversations = await asyncio.to_thread(build_conversations, context, _conversations_needed(load))
    if load.num_requests is not None:
        conversations = _trim_to_requests(conversations, load.num_requests + load.warmup)
    assign_features(conversations, list(load.features), load.tool_choice, load.seed)
    assign_adapters(conversations, load)
    if FIXED_ANSWER_FEATURES.intersection(load.features) and options.ignore_eos:
        context.notices.append(
            "--features tools/structured: those requests are sent without ignore_eos "
            "(an answer ends when its JSON is complete), so their output lengths vary"
        )
    for notice in context.notices:
        console.print(notice)

    workers = load.workers or workers_needed(load.concurrency, load.rate, load.output_len)
    plans = _plans(load, target, options, conversations, workers, keep_text=counter.exact)
    for plan in plans:
        plan.trace_requests = trace_requests
    return _Prepared(options, facts, counter, context.notices, plans, in_process=len(plans) == 1 and load.workers is None)


async def _drive(load: LoadSpec, prepared: _Prepared, console: Console, progress: bool, stop_on_ctrl_c: bool) -> _Driven:
    """Run the workers under the progress display, the Ctrl-C guard and the over-saturation stop."""
    cpu = ClientCpuMonitor()
    total = load.num_requests + load.warmup if load.num_requests is not None else None
    interrupt = Interrupt()
    stop_guard = ctrl_c_stops_load(interrupt, console, GRACE_S) if stop_on_ctrl_c else nullcontext()
    # the prepared requests and imported libraries are not garbage during the load: frozen, the
    # collector skips them, so its pauses stay off the clock (unfrozen after, for sweeps' sake)
    gc.collect()
    gc.freeze()
    detector = oversaturation_detector(load, prepared.plans)
    stopped: list[str] = []
    watcher: asyncio.Task[None] | None = None

    def started(pids: list[int]) -> None:
        nonlocal watcher
        cpu.watch(pids)
        live.start_clock()
        if detector is not None:
            detector.start()
            watcher = asyncio.ensure_future(watch(detector, interrupt, stopped.append))

    try:
        with LiveProgress(console, total, load.duration_s, enabled=progress) as live, stop_guard:
            sink = live.add if detector is None else _both(live.add, detector.observe)
            try:
                outcome = await run_workers(
                    prepared.plans, sink, in_process=prepared.in_process, on_started=started, interrupt=interrupt
                )
            finally:
                if watcher is not None:
                    watcher.cancel()
            await cpu.stop()
    finally:
        gc.unfreeze()
    return _Driven(outcome, cpu.summary(), stopped)


async def _last_scrape(scraper: ServerScraper, warnings: PostRunWarnings) -> ServerBlock:
    """The server block from the scrape after the load (a failed scrape: unavailable, with a warning)."""
    server = await warnings.attempt_async(
        "the last /metrics scrape",
        scraper.stop,
        ServerBlock(available=False, metrics_url=scraper.url),
        "the server's counters are missing",
    )
    if scraper.before is not None and scraper.after is None:
        warnings.add(f"{scraper.url} did not answer after the load; the server's counters are missing")
    return server


async def _check_records(
    records: list[RequestRecord], texts: dict[str, str], counter: TokenCounter, seed: int, warnings: PostRunWarnings
) -> None:
    """Before the figures: re-count answers with the tokenizer and judge the feature answers (their rates count these)."""
    await warnings.attempt_async(
        "re-counting the answers with the tokenizer",
        lambda: asyncio.to_thread(_tokenizer_check, records, texts, counter, seed),
        None,
        "usage is not cross-checked against the tokenizer",
    )
    warnings.attempt(
        "checking the feature answers",
        lambda: check_answers(records),
        None,
        "answers are not judged; the valid rates are missing",
    )


async def _collect_engine_spans(receiver: TraceReceiver, records: list[RequestRecord], warnings: PostRunWarnings) -> EngineTraces:
    """Wait briefly for the engine's spans, copy their timings into the records, stop the receiver.

    Requests without a span are named in one warning, with the likely causes: an engine not
    exporting to this receiver, or a gateway in between that drops `traceparent`.
    """
    wanted = [record.trace_id for record in records if record.ok and record.trace_id and not record.warmup]
    try:
        await warnings.attempt_async(
            "waiting for the engine's trace spans",
            lambda: receiver.wait_for(wanted, SPAN_WAIT_S),
            0,
            "some engine timings are missing",
        )
    finally:
        await receiver.stop()
    matched = attach_engine_timings(records, receiver.spans)
    counted = sum(1 for record in records if record.trace_id and not record.warmup and record.engine_ttft_s is not None)
    if len(wanted) > counted:
        warnings.add(
            f"{len(wanted) - counted} of {len(wanted)} answered requests got no engine span at {receiver.url} "
            f"within {SPAN_WAIT_S:g} s; start the engine with --otlp-traces-endpoint {receiver.url} and "
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, and reach it directly or through a proxy that "
            "forwards the traceparent header; the per-request engine breakdown covers only the others"
        )
    return EngineTraces(
        url=receiver.url,
        spans_received=len(receiver.spans),
        records_matched=matched,
        measured_with_span=counted,
        measured_answered=len(wanted),
        exports=receiver.exports,
    )


def _both(
    first: Callable[[RequestRecord, str | None], None], second: Callable[[RequestRecord], None]
) -> Callable[[RequestRecord, str | None], None]:
    """One record sink feeding the progress display and the over-saturation detector."""

    def sink(record: RequestRecord, text: str | None) -> None:
        first(record, text)
        second(record)

    return sink
