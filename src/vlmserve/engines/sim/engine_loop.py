"""The real-time engine loop: one task runs scheduler steps and emits their tokens on time.

For the vLLM scheduler model a step is priced when it starts; the loop sleeps until
its end, then writes every token of that step to its stream in one pass. One timer
for all streams, no task per stream. Steps run back to back while there is work,
each starting where the previous one ended on the model's clock (so throughput is
the cost model's, not Python's); if the loop falls far behind, it re-syncs to now.

For the constant-latency model the loop sleeps until the next token is due, and a
new request may wake it early.

Slow readers: a stream whose client is behind (`ActiveRequest.backlogged`) is not
written to until its transport drains (see `outputs`); a timer every BACKLOG_RETRY_S
writes what is pending, and finishes the request once all of it is out.

Sleeping: asyncio timers fire up to ~1 ms late (millisecond poll timeouts), so in
step mode the loop wakes 1 ms early and spins the rest, which keeps emission within
a fraction of a millisecond of schedule.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from vlmserve.async_tasks import cancel_and_wait
from vlmserve.engines.sim.metrics import EngineMetrics
from vlmserve.engines.sim.outputs import WRITE_BUFFER_HIGH_BYTES, ActiveRequest
from vlmserve.engines.sim.timing import EmissionTimingRecorder
from vlmserve.engines.sim.trace import EmissionTrace
from vlmserve.sched.engine_core import EngineCore
from vlmserve.sched.frontend import only_fresh_images
from vlmserve.sched.scheduler import SimRequest, StepResult

RESYNC_AFTER_S = 0.050
"""If a step would start this far in the past, start it now instead."""
SPIN_S = 0.001
TIMING_GROUP = 8
"""Chunks written between two clock reads when recording emission timing."""
BACKLOG_RETRY_S = 0.02
"""How often a slow reader's pending tokens are offered to its transport again."""


class EngineLoop:
    """Owns the scheduler, the in-flight requests and the task that drives them."""

    def __init__(
        self,
        core: EngineCore,
        metrics: EngineMetrics,
        timing: EmissionTimingRecorder | None,
        clock: Callable[[], float] = time.monotonic,
        trace: EmissionTrace | None = None,
    ) -> None:
        self.core = core
        self.trace = trace
        self.metrics = metrics
        self.timing = timing
        self.clock = clock
        self.active: dict[str, ActiveRequest] = {}
        self.constant_mode = getattr(core, "is_constant_latency", False)
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._previous_end_s: float | None = None
        self.steps = 0
        self.frozen = False
        """Fault (--freeze-after): the loop takes no more steps; requests are still accepted, and wait."""
        metrics.bind_state(running=lambda: core.num_running, waiting=lambda: core.num_waiting, kv_usage=lambda: core.kv_usage)
        self.lora_modules: frozenset[str] = frozenset()
        """Adapter names requests may run with (set by the server from its config)."""

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        for request in list(self.active.values()):
            self._trace_request(request, "aborted")
            request.resolve("aborted")
        self.active.clear()
        if self.trace is not None:
            self.trace.close()

    # -- requests ------------------------------------------------------------------------------
    def submit(self, request: ActiveRequest) -> None:
        """Hand a request to the scheduler; raises ValueError if it can never run."""
        parsed = request.parsed
        sim_request = SimRequest(
            request_id=request.request_id,
            prompt_token_ids=parsed.prompt_token_ids,
            max_output_tokens=request.plan.num_tokens,
            arrival_s=request.queued_s,
            image_tokens=parsed.image_tokens,
            images=parsed.images,
            output_token_ids=request.plan.token_ids,
            image_items=tuple(parsed.image_items),
            mm_positions=tuple(parsed.image_positions),
            lora=parsed.model if parsed.model in self.lora_modules else None,
        )
        self.core.add_request(only_fresh_images(sim_request, request.image_fresh))
        self.active[request.request_id] = request
        if self.trace is not None:
            request.chunk_s = []
            request.chunk_tokens = []
        self._poke()

    def abort(self, request_id: str) -> None:
        """The client went away (or the stream was cut): stop generating for it."""
        request = self.active.pop(request_id, None)
        self.core.abort_request(request_id)
        if request is not None and not request.aborted:
            request.aborted = True
            self._trace_request(request, "aborted")
            self.metrics.request_success["abort"].inc()
            request.resolve("aborted")

    def freeze(self) -> None:
        """Stop stepping for good (a test's stuck engine core); the HTTP side keeps answering."""
        self.frozen = True
        self._poke()

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    # -- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        clock = self.clock
        while True:
            if self.frozen:
                await loop.create_future()  # never resolved: only stop() (cancelling the task) ends it
            if not core.has_work():
                self._previous_end_s = None
                if self.trace is not None:
                    self.trace.flush()  # idle: whoever reads the trace sees every finished request
                await self._wait(loop, None)
                continue
            now = clock()
            if self.constant_mode:
                due = core.next_event_s(now)
                if due is None or due > now + 0.0002:
                    await self._wait(loop, due)
                    continue
                # Behind schedule: emit everything due by now; its lateness is counted from `due`.
                result = core.step(max(due, now))
                emit_at = due
                ready = self._prepare_chunks(result)
                self._send(ready, emit_at)
                await asyncio.sleep(0)  # let sockets and new requests in between emissions
            else:
                start = self._previous_end_s
                if start is None or now - start > RESYNC_AFTER_S:
                    start = now
                result = core.step(start)
                emit_at = result.end_s
                # Render the step's chunks while the modelled GPU works; only the sends wait for its end.
                ready = self._prepare_chunks(result)
                await self._sleep_until(loop, emit_at)
                self._send(ready, emit_at)
                self._previous_end_s = emit_at
            self.steps += 1
            self._emit(result, emit_at)

    async def _wait(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        """Sleep until `deadline` (None: forever) or until a new request pokes the loop."""
        wake: asyncio.Future[None] = loop.create_future()
        self._wake = wake
        handle = None
        if deadline is not None:
            handle = loop.call_at(deadline, _resolve, wake)
        try:
            await wake
        finally:
            self._wake = None
            if handle is not None:
                handle.cancel()

    async def _sleep_until(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Sleep (not interruptible) to within SPIN_S of the deadline, then spin to it."""
        clock = self.clock
        if deadline - clock() > SPIN_S:
            done: asyncio.Future[None] = loop.create_future()
            loop.call_at(deadline - SPIN_S, _resolve, done)
            await done
        else:
            await asyncio.sleep(0)  # always let I/O in once per step, even when running late
        while clock() < deadline:
            pass

    # -- emission --------------------------------------------------------------------------------
    def _prepare_chunks(self, result: StepResult) -> list[tuple[asyncio.Transport, bytes]]:
        """Pre-render the HTTP chunks of plain streams' middle tokens (the bulk of all chunks).

        Marks them written; everything else (first and last tokens, faults, non-streaming)
        is handled by `_emit` after the sends.
        """
        active_get = self.active.get
        ready: list[tuple[asyncio.Transport, bytes]] = []
        for request_id, count in result.tokens:
            request = active_get(request_id)
            if request is None or not request.plain or count != 1 or request.transport is None:
                continue
            index = request.emitted
            if (
                request.written == index
                and 0 < index < request.plan.num_tokens - 1
                and request.transport.get_write_buffer_size() <= WRITE_BUFFER_HIGH_BYTES
            ):
                ready.append((request.transport, request.plain_frame(index)))
                request.written = index + 1
        return ready

    def _send(self, ready: list[tuple[asyncio.Transport, bytes]], emit_at: float) -> None:
        """Write pre-rendered chunks: the only per-chunk work done at the step boundary."""
        timing = self.timing
        clock = self.clock
        since_clock = 0
        for transport, frame in ready:
            if transport.is_closing():
                continue  # client gone; `_emit` notices and aborts it
            transport.write(frame)
            since_clock += 1
            if since_clock == TIMING_GROUP and timing is not None:  # inlined _GroupTimer: hottest loop
                timing.record(clock() - emit_at, since_clock)
                since_clock = 0
        if since_clock and timing is not None:
            timing.record(clock() - emit_at, since_clock)

    def _emit(self, result: StepResult, emit_at: float) -> None:
        """Deliver one step's tokens and finishes to their requests, and update the metrics."""
        self._count_step(result)
        lost = self._emit_tokens(result, emit_at)
        self._finish_requests(result.finished, emit_at)
        for request_id in lost:
            self.abort(request_id)

    def _count_step(self, result: StepResult) -> None:
        """The step's scheduler counters: queue times of newly scheduled requests, preemptions, cache, tokens."""
        metrics = self.metrics
        active = self.active
        for request_id, _cached in result.first_scheduled:
            request = active.get(request_id)
            if request is not None:
                request.scheduled_s = result.start_s
                metrics.request_queue_time.observe(max(0.0, result.start_s - request.queued_s))
        if result.preempted:
            metrics.num_preemptions.inc(len(result.preempted))
        if result.prefix_queries_tokens:
            metrics.prefix_cache_queries.inc(result.prefix_queries_tokens)
            metrics.prefix_cache_hits.inc(result.prefix_hits_tokens)
        if result.tokens:
            metrics.generation_tokens.inc(len(result.tokens))

    def _emit_tokens(self, result: StepResult, emit_at: float) -> list[str]:
        """One pass over the step's tokens: bookkeeping, and the chunks `_send` did not cover.

        The per-token hot path; once-per-request work (the first token, arming a slow
        reader's retry) is in helpers. Returns the requests whose client is gone.
        """
        timer = _GroupTimer(self.timing, self.clock, emit_at)
        active_get = self.active.get
        itl_values: list[float] = []
        itl_append = itl_values.append
        lost: list[str] = []
        sent_s = self.clock() if self.trace is not None else 0.0  # after `_send`'s writes
        for request_id, count in result.tokens:
            request = active_get(request_id)
            if request is None:
                continue
            if request.chunk_s is not None:
                request.chunk_s.append(sent_s)
                request.chunk_tokens.append(count)  # type: ignore[union-attr]
            index = request.emitted
            request.emitted = index + count
            if request.first_token_s is None:
                self._first_token(request, emit_at)
            else:
                itl_append(emit_at - request.last_token_s)
            request.last_token_s = emit_at
            transport = request.transport
            if transport is None:
                request.written = request.emitted
                continue
            if request.written >= request.emitted:  # sent by `_send`
                if transport.is_closing():
                    lost.append(request_id)
                continue
            if not self._deliver(request):
                lost.append(request_id)
                continue
            if request.backlogged:
                self._arm_backlog_retry(request)
            timer.tick()
        timer.flush()
        if itl_values:
            self.metrics.inter_token_latency.observe_many(itl_values)
        return lost

    def _first_token(self, request: ActiveRequest, emit_at: float) -> None:
        """A request's first token: its TTFT, prefill time and prompt tokens (once per request)."""
        metrics = self.metrics
        request.first_token_s = emit_at
        metrics.time_to_first_token.observe(emit_at - request.arrival_s)
        if request.scheduled_s is not None:
            metrics.request_prefill_time.observe(max(0.0, emit_at - request.scheduled_s))
        metrics.prompt_tokens.inc(len(request.parsed.prompt_token_ids))

    def _arm_backlog_retry(self, request: ActiveRequest) -> None:
        """A slow reader's pending tokens are offered again on a timer (one at a time; not while stalled)."""
        if request._flush_handle is None and request.stall_after is None:
            request._flush_handle = asyncio.get_running_loop().call_later(BACKLOG_RETRY_S, self._flush_backlog, request)

    def _finish_requests(self, finished: list[str], emit_at: float) -> None:
        """Retire the step's finished requests: their outcome metrics, and resolve those fully written."""
        metrics = self.metrics
        active = self.active
        for request_id in finished:
            request = active.pop(request_id, None)
            if request is None:
                continue
            request.finish_reason = request.plan.finish_reason
            self._trace_request(request, "finished")
            metrics.request_success[request.plan.finish_reason].inc()
            metrics.e2e_request_latency.observe(emit_at - request.arrival_s)
            metrics.request_generation_tokens.observe(request.plan.num_tokens)
            metrics.request_prompt_tokens.observe(len(request.parsed.prompt_token_ids))
            if request.written >= request.plan.num_tokens:
                request.resolve("finished")
            # else: a stalled or slow-read stream; its flush timer resolves it (or the client gives up).

    def _trace_request(self, request: ActiveRequest, outcome: str) -> None:
        """Append the request's emission times to the trace, once (it then stops collecting)."""
        if self.trace is None or request.chunk_s is None:
            return
        self.trace.write(
            request.request_id, request.client_request_id, request.arrival_s, request.chunk_s, request.chunk_tokens or [], outcome
        )
        request.chunk_s = None

    def _deliver(self, request: ActiveRequest) -> bool:
        """Write what the client may see now, applying stall/drop faults; False if the client is gone."""
        target = request.emitted
        if request.drop_after is not None and target > request.drop_after:
            request.write_tokens_upto(request.drop_after)
            transport = request.transport
            if transport is not None:
                transport.abort()  # RST, no terminating chunk: a dropped connection
            request.resolve("dropped")
            return False
        if request.stall_after is not None and target > request.stall_after:
            if request.stalled_forever:
                return request.write_tokens_upto(request.stall_after)
            now = self.clock()
            if request.stall_until_s is None:
                request.stall_until_s = now + (request.stall_duration_s or 0.0)
                if not request.write_tokens_upto(request.stall_after):
                    return False
                request._flush_handle = asyncio.get_running_loop().call_at(request.stall_until_s, self._flush_stalled, request)
                return True
            if now < request.stall_until_s:
                return not (request.transport is not None and request.transport.is_closing())
        return request.write_tokens_upto(target)

    def _flush_stalled(self, request: ActiveRequest) -> None:
        """End of an injected stall: send what piled up, finish if the engine already did."""
        request.stall_after = None
        self._flush_backlog(request)

    def _flush_backlog(self, request: ActiveRequest) -> None:
        """Offer pending tokens to the transport again; finish, retry later, or give up on a gone client."""
        request._flush_handle = None
        if not request.write_tokens_upto(request.emitted):
            self.abort(request.request_id)
            request.resolve("aborted")  # already finished by the engine: abort() no longer holds it
            return
        if request.backlogged:
            request._flush_handle = asyncio.get_running_loop().call_later(BACKLOG_RETRY_S, self._flush_backlog, request)
        elif request.finish_reason is not None and request.written >= request.plan.num_tokens:
            request.resolve("finished")


class _GroupTimer:
    """Records emission lateness once per TIMING_GROUP chunks.

    The clock is read after the group's last write, which bounds the lateness of every
    chunk in the group: the recorded distribution never understates it.
    """

    __slots__ = ("timing", "clock", "emit_at", "untimed")

    def __init__(self, timing: EmissionTimingRecorder | None, clock: Callable[[], float], emit_at: float) -> None:
        self.timing = timing
        self.clock = clock
        self.emit_at = emit_at
        self.untimed = 0

    def tick(self) -> None:
        self.untimed += 1
        if self.untimed == TIMING_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.untimed and self.timing is not None:
            self.timing.record(self.clock() - self.emit_at, self.untimed)
        self.untimed = 0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
