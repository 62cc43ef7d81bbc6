"""When requests are sent and when sending stops, in one or more worker processes.

A *strategy* decides send times: a closed loop (N users, each sending its next request
when its previous answer ends) or an open loop (absolute send offsets: constant,
Poisson or gamma with a burstiness; or a trace's own arrival times). A *constraint*
stops sending: a request count or a duration (requests in flight at the end are awaited
and counted). Each worker runs one asyncio loop with its own connection pool; several
workers are separate processes so a heavy load never waits on one Python thread.
Records go back to the parent in small batches as they finish.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import multiprocessing
import os
import queue as queue_module
import random
import signal
import sys
import time
import traceback
import types
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

from vlmserve.bench.client import RequestOptions, build_body, encode_body, stream_request
from vlmserve.bench.http_stream import ConnectionPool
from vlmserve.bench.interrupt import GRACE_S, Interrupt
from vlmserve.bench.workloads import Conversation, Turn, fresh_variant
from vlmserve.json_types import JSONObject
from vlmserve.results.records import RequestRecord

RecordSink = Callable[[RequestRecord, str | None], None]

# --- strategies: send offsets of an open loop ---------------------------------------------------


def arrival_offsets(
    arrival: str, rate: float, burstiness: float, rng: random.Random, *, count: int | None, duration_s: float | None
) -> list[float]:
    """Send offsets (seconds from the start) for an open loop; stops at `count` or `duration_s`.

    constant: every 1/rate; poisson: exponential gaps of mean 1/rate; gamma: gaps with
    shape `burstiness` and the same mean (burstiness < 1 is burstier than Poisson).
    """
    offsets: list[float] = []
    now = 0.0
    mean_gap = 1.0 / rate
    while True:
        if count is not None and len(offsets) >= count:
            return offsets
        if duration_s is not None and now >= duration_s:
            return offsets
        offsets.append(now)
        if arrival == "constant":
            now = len(offsets) * mean_gap  # from the index, so no rounding drift accumulates
        elif arrival == "poisson":
            now += rng.expovariate(rate)
        else:
            now += rng.gammavariate(burstiness, mean_gap / burstiness)


# --- what a worker is given ------------------------------------------------------------------


@dataclass
class WorkItem:
    """One conversation to send: prebuilt bodies per turn (None = build from live history)."""

    conversation: Conversation
    bodies: list[bytes | None]
    offset_s: float | None = None
    """Open loop: send offset of the first turn. None in a closed loop."""
    warmup: bool = False
    variant: int = 0
    """How many times the prepared conversation was sent before in this run (0: first use)."""


@dataclass
class WorkerPlan:
    """Everything one worker needs; pickled to a worker process."""

    index: int
    url: str
    headers: dict[str, str]
    options: RequestOptions
    items: list[WorkItem]
    users: int | None = None
    """Closed loop: concurrent users in this worker. None: open loop."""
    max_requests: int | None = None
    """Closed loop: requests (turns) this worker sends, warm-up included."""
    warmup_requests: int = 0
    duration_s: float | None = None
    multi_turn: str = "first"
    timeout_s: float = 600.0
    keep_text: bool = False
    """Ship answer texts back (for the tokenizer check)."""
    clock_offset: float = 0.0
    grace_s: float = GRACE_S
    """After a first Ctrl-C, how long requests in flight may take to finish."""
    fresh_seed: int | None = None
    """A conversation sent again (variant > 0) is reshuffled from this seed so the prefix cache
    has not seen it; None: repeats are sent as they are (an explicit prompt pool)."""
    trace_requests: bool = False
    """Send each request with its own W3C traceparent (engine traces join the bench's trace ids)."""


def build_item_bodies(conversation: Conversation, options: RequestOptions, multi_turn: str) -> list[bytes | None]:
    """Serialise every turn the parent can build; live multi-turn leaves later turns to the worker."""
    bodies: list[bytes | None] = []
    history: list[JSONObject] = [chat_message("system", conversation.system)] if conversation.system else []
    for index, turn in enumerate(conversation.turns):
        if multi_turn == "live" and index > 0:
            bodies.append(None)
            continue
        bodies.append(encode_body(_body_for(options, history, turn)))
        history = history + [chat_message("user", turn.content)]
        history.append(chat_message("assistant", turn.reference_reply or ""))
    return bodies


def chat_message(role: str, content: str | list[JSONObject] | None) -> JSONObject:
    """One chat message: text, or OpenAI content parts (None: an answer whose text was not kept)."""
    return {"role": role, "content": [*content] if isinstance(content, list) else content}


def _body_for(options: RequestOptions, history: list[JSONObject], turn: Turn) -> JSONObject:
    content, text, max_tokens = turn.content, turn.text, turn.max_tokens
    if options.api == "chat":
        body = build_body(options, max_tokens, messages=[*history, chat_message("user", content)])
        if turn.mm_processor_kwargs:
            given = body.get("mm_processor_kwargs")  # the run's --mm-processor-kwargs, which the turn's extend
            body["mm_processor_kwargs"] = {**(given if isinstance(given, dict) else {}), **turn.mm_processor_kwargs}
        if turn.features is not None:
            turn.features.apply(body, options.extra_body)
    else:
        prompt = "\n".join(str(message["content"]) for message in history) + ("\n" if history else "") + text
        body = build_body(options, max_tokens, prompt=prompt)
    if turn.adapter is not None:
        body["model"] = turn.adapter
    return body


def request_type_of(declared: str, image_count: int) -> str:
    """The turn's own type; a turn left at "text" that carries images is typed by its image count."""
    from vlmserve.bench.workloads.images import request_type

    return declared if declared != "text" or image_count == 0 else request_type(image_count)


def new_traceparent() -> tuple[str, bytes]:
    """A fresh trace id and its sampled W3C `traceparent` header line (vLLM's span joins that trace)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, f"traceparent: 00-{trace_id}-{span_id}-01\r\n".encode("ascii")


# --- one worker's loop ----------------------------------------------------------------------


class _Slots:
    """The request budget of a closed-loop worker (warm-up first)."""

    def __init__(self, limit: int | None, warmup: int) -> None:
        self.limit, self.warmup, self.taken = limit, warmup, 0

    def claim(self) -> tuple[bool, bool]:
        """(may send, is warm-up)."""
        if self.limit is not None and self.taken >= self.limit:
            return False, False
        self.taken += 1
        return True, self.taken <= self.warmup


async def drive(plan: WorkerPlan, sink: RecordSink, start_perf: float, interrupt: Interrupt | None = None) -> None:
    """Run one worker's share of the load, starting at `start_perf` (perf_counter time)."""
    interrupt = interrupt or Interrupt()
    stopping = interrupt.stopping
    pool = ConnectionPool(plan.url, plan.headers)
    try:
        sequence = itertools.count()
        deadline = start_perf + plan.duration_s if plan.duration_s is not None else None

        async def send_conversation(item: WorkItem, scheduled_perf: float, slots: _Slots | None) -> float:
            """Send every turn of a conversation; returns when the last one ended (perf time)."""
            conversation, bodies = item.conversation, item.bodies
            if item.variant and plan.fresh_seed is not None:  # a repeat: send an unseen variant
                conversation, bodies = fresh_variant(conversation, plan.fresh_seed, item.variant), []
            history: list[JSONObject] = [chat_message("system", conversation.system)] if conversation.system else []
            for turn_index, turn in enumerate(conversation.turns):
                warmup = item.warmup
                if stopping.is_set():
                    return scheduled_perf
                if slots is not None:
                    allowed, warmup = slots.claim()
                    if not allowed or (deadline is not None and time.perf_counter() >= deadline):
                        return scheduled_perf
                body = bodies[turn_index] if turn_index < len(bodies) else None
                if body is None:
                    body = encode_body(_body_for(plan.options, history, turn))
                record = RequestRecord(
                    request_id=f"w{plan.index}-{next(sequence)}",
                    scheduled_at_s=scheduled_perf + plan.clock_offset,
                    sent_at_s=0.0,
                    requested_prompt_tokens=turn.requested_prompt_tokens if turn_index == 0 else None,
                    requested_output_tokens=turn.requested_output_tokens,
                    image_count=turn.image_count,
                    request_type=request_type_of(turn.request_type, turn.image_count),
                    adapter=turn.adapter,
                    image_repeat=turn.image_repeat,
                    workload=conversation.workload,
                    turn_index=turn_index,
                    conversation_id=conversation.conversation_id,
                    warmup=warmup,
                    worker=plan.index,
                )
                if turn.features is not None:
                    turn.features.mark(record)
                keep = plan.keep_text or plan.multi_turn == "live" or (turn.features is not None and turn.features.keeps_answer)
                extra = b""
                if plan.trace_requests:
                    record.trace_id, extra = new_traceparent()
                try:
                    text = await stream_request(
                        pool,
                        body,
                        record,
                        clock_offset=plan.clock_offset,
                        timeout_s=plan.timeout_s,
                        keep_text=keep,
                        extra_headers=extra,
                    )
                except asyncio.CancelledError:
                    sink(record, None)  # stopped mid-answer: the record says so and is kept
                    raise
                if record.features and "structured" in record.features:
                    record.answer_text = text
                sink(record, text if plan.keep_text else None)
                scheduled_perf = time.perf_counter()
                if not record.ok:
                    return scheduled_perf  # later turns depend on this answer
                history = history + [
                    chat_message("user", turn.content),
                    chat_message("assistant", text if plan.multi_turn == "live" else (turn.reference_reply or "")),
                ]
            return scheduled_perf

        if plan.users is None:
            load = _open_loop(plan, send_conversation, start_perf, deadline, stopping)
        else:
            load = _closed_loop(plan, send_conversation, start_perf, deadline, stopping)
        await _until_interrupted(load, interrupt, plan.grace_s)
    finally:
        pool.close()


async def _until_interrupted(load: Awaitable[object], interrupt: Interrupt, grace_s: float) -> None:
    """Run the load; once stopped, give requests in flight `grace_s` (or until STOP_NOW), then cancel."""
    task = asyncio.ensure_future(load)
    stop_wait = asyncio.ensure_future(interrupt.stopping.wait())
    now_wait: asyncio.Future[Literal[True]] | None = None
    try:
        await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            now_wait = asyncio.ensure_future(interrupt.now.wait())
            await asyncio.wait({task, now_wait}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not interrupt.stopping.is_set():
                raise
    finally:
        for waiter in (stop_wait, now_wait, task):
            if waiter is not None and not waiter.done():
                waiter.cancel()


_STOP_CHECK_S = 0.2
"""An open loop waiting longer than this for its next send wakes early when the run is stopped."""


async def _open_loop(
    plan: WorkerPlan, send: Callable, start_perf: float, deadline: float | None, stopping: asyncio.Event
) -> None:
    in_flight: set[asyncio.Task] = set()
    for item in plan.items:
        target = start_perf + (item.offset_s or 0.0)
        if deadline is not None and target >= deadline:
            break
        delay = target - time.perf_counter()
        if delay > _STOP_CHECK_S:  # a long gap: wake early if the run is stopped
            try:
                await asyncio.wait_for(stopping.wait(), delay)
            except TimeoutError:
                pass
        elif delay > 0:
            await asyncio.sleep(delay)
        if stopping.is_set():
            break
        task = asyncio.create_task(send(item, target, None))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)


def repeat_items(items: list[WorkItem]) -> Iterator[WorkItem]:
    """The items over and over, each pass marked as a later variant (so repeats can be sent fresh)."""
    if not items:
        return
    for variant in itertools.count():
        for item in items:
            yield item if variant == 0 else WorkItem(item.conversation, item.bodies, item.offset_s, item.warmup, variant)


async def _closed_loop(
    plan: WorkerPlan, send: Callable, start_perf: float, deadline: float | None, stopping: asyncio.Event
) -> None:
    slots = _Slots(plan.max_requests, plan.warmup_requests)
    # Users share one endless stream of conversations; the slots or the deadline stop it.
    source: Iterator[WorkItem] = repeat_items(plan.items)

    async def user() -> None:
        scheduled = start_perf
        for item in source:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            if (plan.max_requests is not None and slots.taken >= plan.max_requests) or stopping.is_set():
                return
            scheduled = await send(item, scheduled, slots)

    delay = start_perf - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    await asyncio.gather(*(user() for _ in range(plan.users or 1)))


# --- worker processes --------------------------------------------------------------------------

_FLUSH_EVERY_S = 0.1

WorkerMessage = tuple[str, int, "int | str | list[tuple[RequestRecord, str | None]] | None"]
"""(kind, worker index, payload): ("ready", i, pid), ("records", i, batch), ("done", i, None), ("error", i, traceback)."""


class _Shared(Protocol):
    """A number shared with the worker processes (`multiprocessing.Value`)."""

    value: float


class _Outbox(Protocol):
    """The queue a worker puts its messages on (`multiprocessing.Queue`)."""

    def put(self, message: WorkerMessage) -> None: ...


class _StartSignal(Protocol):
    """The event every worker waits on before its clock starts (`multiprocessing.Event`)."""

    def wait(self, timeout: float | None = None) -> bool: ...


def _worker_process(plan: WorkerPlan, results: _Outbox, go: _StartSignal, start_at: _Shared, stop_level: _Shared) -> None:
    """Entry point of a worker process: one asyncio loop, records sent back in batches.

    Ctrl-C reaches every process of the terminal's group; workers ignore it and follow the
    parent's `stop_level` instead, so records in flight are kept rather than lost.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_worker_main(plan, results, go, start_at, stop_level))
    except BaseException:  # noqa: BLE001 - the parent reports it as one line
        results.put(("error", plan.index, traceback.format_exc(limit=4)))


async def _worker_main(plan: WorkerPlan, results: _Outbox, go: _StartSignal, start_at: _Shared, stop_level: _Shared) -> None:
    batch: list[tuple[RequestRecord, str | None]] = []
    interrupt = Interrupt()

    def sink(record: RequestRecord, text: str | None) -> None:
        batch.append((record, text))

    async def flusher() -> None:
        while True:
            await asyncio.sleep(_FLUSH_EVERY_S)
            interrupt.raise_to(int(stop_level.value))
            if batch:
                results.put(("records", plan.index, batch[:]))
                batch.clear()

    gc.collect()
    gc.freeze()  # the plan's prepared requests live for the whole run: keep GC pauses short
    results.put(("ready", plan.index, os.getpid()))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, go.wait)
    flush_task = asyncio.create_task(flusher())
    await drive(plan, sink, start_at.value, interrupt)
    flush_task.cancel()
    if batch:
        results.put(("records", plan.index, batch[:]))
    results.put(("done", plan.index, None))


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start spawned workers without re-importing the caller's __main__.

    A spawned child normally re-runs the parent's main script; a caller (a user's script,
    a notebook) need not guard it with `if __name__ == "__main__"`, and the worker needs
    nothing from it. The stand-in is in place only while the processes start.
    """
    real_main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real_main


@dataclass
class LoadOutcome:
    """What the load phase produced, before any figures are computed."""

    records: list[RequestRecord]
    texts: dict[str, str]
    start_wall_s: float
    end_wall_s: float
    worker_pids: list[int] = field(default_factory=list)
    in_process: bool = True
    interrupted: bool = False
    """Stopped by Ctrl-C: the records are what was sent until then."""


class WorkerFailed(RuntimeError):
    """A worker process died; its message is the worker's traceback tail."""


async def run_workers(
    plans: list[WorkerPlan],
    on_record: RecordSink,
    *,
    in_process: bool,
    on_started: Callable[[list[int]], None] | None = None,
    interrupt: Interrupt | None = None,
) -> LoadOutcome:
    """Run every plan (in this loop, or one process each) and collect their records.

    `interrupt` (raised by the caller's Ctrl-C handler) stops the load early; the records
    collected so far are returned, marked `interrupted`.
    """
    interrupt = interrupt or Interrupt()
    records: list[RequestRecord] = []
    texts: dict[str, str] = {}

    def collect(record: RequestRecord, text: str | None) -> None:
        records.append(record)
        if text is not None:
            texts[record.request_id] = text
        on_record(record, text)

    if in_process:
        start_perf = time.perf_counter() + 0.02
        start_wall = start_perf + plans[0].clock_offset
        if on_started:
            on_started([os.getpid()])
        await asyncio.gather(*(drive(plan, collect, start_perf, interrupt) for plan in plans))
        return LoadOutcome(records, texts, start_wall, time.time(), [os.getpid()], True, interrupt.level > 0)

    pool = _WorkerPool(plans, interrupt)
    try:
        pids = await pool.wait_ready()
        start_wall = pool.start()
        if on_started:
            on_started(pids)
        errors = await pool.collect_until_done(collect)
    finally:
        pool.stop()
    if errors:
        raise WorkerFailed("; ".join(errors))
    return LoadOutcome(records, texts, start_wall, time.time(), pids, False, interrupt.level > 0)


class _WorkerPool:
    """One spawned process per plan, talking over one queue: ("ready", index, pid), ("records",
    index, [(record, text), ...]), ("done", index, None) or ("error", index, traceback)."""

    def __init__(self, plans: list[WorkerPlan], interrupt: Interrupt) -> None:
        context = multiprocessing.get_context("spawn")
        self.plans = plans
        self.interrupt = interrupt
        self.results = context.Queue()
        self.go = context.Event()
        self.start_at = context.Value("d", 0.0)
        stop_level = context.Value("i", 0)
        interrupt.listen(lambda level: setattr(stop_level, "value", level))
        self.processes = [
            context.Process(
                target=_worker_process,
                args=(plan, self.results, self.go, self.start_at, stop_level),
                daemon=True,
                name=f"vlmserve-bench-w{plan.index}",
            )
            for plan in plans
        ]
        with _main_module_hidden():
            for process in self.processes:
                process.start()

    async def _receive(self) -> WorkerMessage | None:
        """The next message, or None after half a second without one (off the event loop)."""

        def receive() -> WorkerMessage | None:
            try:
                message: WorkerMessage = self.results.get(timeout=0.5)
                return message
            except queue_module.Empty:
                return None

        return await asyncio.get_running_loop().run_in_executor(None, receive)

    async def wait_ready(self) -> list[int]:
        """Wait until every worker has prepared its requests; their pids, in the order they got ready."""
        ready: dict[int, int] = {}
        while len(ready) < len(self.plans):
            if self.interrupt.level:
                raise KeyboardInterrupt  # nothing was sent yet: nothing to keep
            message = await self._receive()
            if message is None:
                dead = [p for p in self.processes if not p.is_alive()]
                if dead:
                    raise WorkerFailed(f"bench worker exited with code {dead[0].exitcode} before starting")
                continue
            kind, index, payload = message
            if kind == "ready":
                assert isinstance(payload, int)
                ready[index] = payload
            elif kind == "error":
                assert isinstance(payload, str)
                raise WorkerFailed(payload.strip().splitlines()[-1])
        return list(ready.values())

    def start(self) -> float:
        """Start every worker's clock at one shared instant; returns it on the wall clock."""
        self.start_at.value = time.perf_counter() + 0.05
        self.go.set()
        return float(self.start_at.value) + self.plans[0].clock_offset

    async def collect_until_done(self, collect: RecordSink) -> list[str]:
        """Feed every record to `collect` until each worker is done, failed or gone; the failures."""
        pending = {plan.index for plan in self.plans}
        errors: list[str] = []
        while pending:
            message = await self._receive()
            if message is None:
                message = await self._reap_dead(pending, errors)
                if message is None:
                    continue
            kind, index, payload = message
            if kind == "records":
                assert isinstance(payload, list)
                for record, text in payload:
                    collect(record, text)
            elif kind == "done":
                pending.discard(index)
            elif kind == "error":
                assert isinstance(payload, str)
                pending.discard(index)
                errors.append(f"worker {index}: {payload.strip().splitlines()[-1]}")
        return errors

    async def _reap_dead(self, pending: set[int], errors: list[str]) -> WorkerMessage | None:
        """After a quiet spell: a dead worker's late final batch if one arrives, else it is written off."""
        for plan, process in zip(self.plans, self.processes):
            if plan.index in pending and not process.is_alive():
                late = await self._receive()  # give a final batch already on its way a moment to arrive
                if late is not None:
                    return late
                pending.discard(plan.index)
                errors.append(f"worker {plan.index} exited with code {process.exitcode}")
        return None

    def stop(self) -> None:
        """Release workers still waiting for the start, then join them (terminated if they hang)."""
        self.go.set()
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


def workers_needed(concurrency: int | None, rate: float | None, output_len: int = 64, cpu_count: int | None = None) -> int:
    """Worker processes a load needs, at most one per core.

    What costs a worker CPU is the stream of chunks it parses, so an open loop is sized by its
    expected chunks per second (one worker per ~5,000; a Python worker saturates a little above
    10,000), a closed loop by its users (one worker per 128 streams).
    """
    cores = cpu_count or os.cpu_count() or 1
    if rate is not None:
        need = math.ceil(rate * (output_len + 2) / CHUNKS_PER_WORKER)
    else:
        need = math.ceil((concurrency or 1) / STREAMS_PER_WORKER)
    return max(1, min(need, cores))


CHUNKS_PER_WORKER = 5000.0
STREAMS_PER_WORKER = 128
