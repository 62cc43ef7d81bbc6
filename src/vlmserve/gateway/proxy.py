"""Forwarding one generation request: choose, send, retry before the first byte, stream through.

The rules this module keeps:
- A request is retried on another replica only while nothing has been sent to the client
  (connect failure, 5xx/429, the replica closing or timing out before its first byte), and
  only while the retry budget allows.
- The client's response starts only once the upstream's first payload is in hand (relay.py's
  ARMED state), so every failure up to then is still retryable. After that, payload is passed
  on as it arrives (never buffered beyond the SSE event it ends); a replica that dies, stalls or
  sends garbage mid-stream ends the stream with a final SSE error event — the client never hangs.
- A client that goes away cancels the handler; closing the upstream connection makes the
  engine abort the request.
- Every attempt ends with exactly one policy.on_finish and one in-flight decrement.

Who caused a failure decides whether it counts towards ejecting the replica (its breaker):
- The replica: connect errors, timeouts (first byte, stalled stream), a stream closed or broken
  by the replica. These count at once.
- Undecided: an error answer (5xx) is what a broken replica and a poison request (one that
  makes any engine fail) look like alike. It counts nothing when it happens; the request goes
  to another replica. If that one serves it (2xx), the first replica's 5xx counts against it.
  If that one answers 5xx too, the request is at fault: it is not retried further, the second
  answer is returned, and neither replica is charged. A 5xx with no second opinion (retries
  or the retry budget exhausted, no other replica) is never charged: a poison request cannot
  open breakers, whatever its rate.
- Nobody: 429 (the replica is busy) and 4xx answers (the request is wrong).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

from vlmserve.gateway.openai_errors import CLIENT_REQUEST_ID_HEADER, error_response, sse_error_event
from vlmserve.gateway.relay import USAGE_KEY, RelayEnd, StreamRelay
from vlmserve.gateway.replicas import Replica, ReplicaPool
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.retry_budget import RetryBudget
from vlmserve.gateway.routing import Outcome, RoutingPolicy
from vlmserve.gateway.watchdog import FIRST_TOKEN, Exchange, Watchdog
from vlmserve.http1.client import ClientPool, ClientResponse
from vlmserve.http1.headers import header_lines
from vlmserve.http1.messages import Answer, Request, Response, Stream

RETRYABLE_STATUS = {429, 500, 502, 503, 504}
CONNECTION_ERRORS = (OSError, asyncio.IncompleteReadError)  # upstream.ClientError is an OSError


@dataclass(slots=True)
class RequestLog:
    """What the audit log and the metrics learn about one request."""

    request_id: str  # the gateway's own, made per request: keys every count, sent to the replica
    path: str
    client_request_id: str | None = None  # the client's X-Request-ID, checked (request_info.py): recorded only
    tenant: str = "anonymous"
    model: str | None = None
    adapter: str | None = None  # the LoRA adapter the model names (gateway/adapters.py); None: the base model
    stream: bool = False
    priority: str = "interactive"
    replica: str = "none"
    attempts: list[dict[str, Any]] = field(default_factory=list)
    received_at: float = 0.0  # wall clock, for people
    received_mono: float = 0.0  # monotonic, for durations
    first_byte_mono: float | None = None
    finished_mono: float | None = None
    status: str = "pending"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    images: list[dict[str, Any]] = field(default_factory=list)  # image_preflight.ImageSeen.audit()
    trace: Any = None  # its spans (observe/tracing.py RequestTrace) when tracing is on

    def id_headers(self) -> dict[str, str]:
        """The response's id headers: the gateway's id, and the client's echoed when it sent one."""
        if self.client_request_id is None:
            return {"X-Request-ID": self.request_id}
        return {"X-Request-ID": self.request_id, CLIENT_REQUEST_ID_HEADER: self.client_request_id}

    def note_usage(self, usage: object) -> None:
        """The engine's token counts, from the `usage` object of its answer (when it is one)."""
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)

    def to_record(self) -> dict[str, Any]:
        """The audit log's line: the fields in _RECORD_FIELDS, the retries, and times as ms after receipt."""

        def ms(mono: float | None) -> float | None:
            return None if mono is None else round((mono - self.received_mono) * 1000, 3)

        return {
            "id": self.request_id,
            **{name: getattr(self, name) for name in _RECORD_FIELDS},
            "retries": self.retries,
            "ttft_ms": ms(self.first_byte_mono),
            "e2e_ms": ms(self.finished_mono),
            **({"images": self.images} if self.images else {}),
        }


_RECORD_FIELDS = (
    "client_request_id",
    "tenant",
    "model",
    "adapter",
    "path",
    "stream",
    "priority",
    "replica",
    "status",
    "attempts",
    "received_at",
    "prompt_tokens",
    "completion_tokens",
    "error",
)


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE = re.compile(r"[ -~]{1,512}")  # printable ASCII, W3C's length limit


def trace_context(client_headers: Mapping[str, str]) -> dict[str, str]:
    """The client's W3C trace context (`traceparent`, `tracestate`), when well formed: vLLM joins its
    per-request span to that trace, so a client can tell where its request's time went in the engine
    (bench --engine-traces). Malformed values are dropped, never forwarded."""
    parent = client_headers.get("traceparent", "")
    if not parent or not _TRACEPARENT.fullmatch(parent):
        return {}
    state = client_headers.get("tracestate", "")
    return {"traceparent": parent, **({"tracestate": state} if _TRACESTATE.fullmatch(state) else {})}


# Who an attempt's failure is charged to (see the module docstring).
FAULT_REPLICA = "replica"  # counts towards ejecting the replica now
FAULT_UNDECIDED = "undecided"  # an error answer: charged only if another replica serves the request
FAULT_NOBODY = "nobody"  # the replica was busy (429): nothing is charged


class _RetryableFailure(Exception):
    """An attempt failed before anything reached the client."""

    def __init__(self, reason: str, message: str, response: Response | None = None, fault: str = FAULT_REPLICA) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.response = response  # the replica's own error answer, passed on if retries run out
        self.fault = fault


def _usage_from_sse_tail(tail: bytes) -> dict | None:
    """The `usage` object of the last SSE event that carries one (engines send it last)."""
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and line.find(USAGE_KEY) >= 0:
            try:
                usage = json.loads(line[6:]).get("usage")
            except ValueError:
                continue
            if isinstance(usage, dict):
                return usage
    return None


def _whole_answer(upstream: ClientResponse, payload: bytes, log: RequestLog) -> Response:
    """A replica's answer read whole, passed on with its status and content type and the ids."""
    return Response(
        upstream.status, payload, {"Content-Type": upstream.headers.get("content-type", "application/json"), **log.id_headers()}
    )


@dataclass(eq=False)
class Forwarder:
    """Sends generation requests to replicas on behalf of the app."""

    pool: ReplicaPool
    policy: RoutingPolicy
    upstream: ClientPool
    watchdog: Watchdog
    _: KW_ONLY
    max_attempts: int
    retry_budget: RetryBudget
    idle_chunk_timeout_s: float
    first_token_timeout_s: float
    upstream_auth: InitVar[str | None] = None
    on_retry: Any = None

    def __post_init__(self, upstream_auth: str | None) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # the header lines every upstream request carries, encoded once
        self._fixed_headers = header_lines(
            [("Content-Type", "application/json"), *([("Authorization", f"Bearer {upstream_auth}")] if upstream_auth else [])]
        )

    def _upstream_headers(self, request_id: str, client_headers: Mapping[str, str]) -> bytes:
        trace = trace_context(client_headers)
        lines = self._fixed_headers + b"X-Request-ID: %s\r\n" % request_id.encode("latin-1")
        return lines + header_lines(trace.items()) if trace else lines

    async def forward(self, request: Request, body: bytes, routed: RoutedRequest, log: RequestLog) -> Answer:
        """Try replicas until one answers; the returned response may already be sent (streams)."""
        self.retry_budget.on_request()
        excluded: set[int] = set()
        last_failure: _RetryableFailure | None = None
        suspect: Replica | None = None  # answered 5xx; charged only if another replica serves the request
        while True:
            candidates = self.pool.candidates(routed.model, excluded)
            if not candidates:
                break
            replica = self.policy.choose(routed, candidates)
            try:
                response = await self._attempt(request, body, routed, replica, log)
            except _RetryableFailure as failure:
                last_failure = failure
                log.attempts[-1]["error"] = failure.reason
                excluded.add(replica.index)
                if failure.fault == FAULT_UNDECIDED:
                    if suspect is not None:  # a second replica failed it too: the request's fault
                        failure.message += " (as did another replica: the request is at fault; not retried)"
                        break
                    suspect = replica
                if len(log.attempts) >= self.max_attempts:
                    break
                if not self.pool.candidates(routed.model, excluded):
                    break
                if not self.retry_budget.try_spend():
                    failure.message += " (retry budget exhausted)"
                    break
                if self.on_retry is not None:
                    self.on_retry(replica, failure.reason)
            else:
                if suspect is not None and response.status < 300:  # served here: the 5xx was the replica's
                    self.pool.record_failure(suspect)
                return response
        if last_failure is None:
            log.status, log.error = "503", "no healthy replica"
            what = f"model {routed.model!r}" if routed.model else "this request"
            return error_response(
                503,
                f"no healthy replica can serve {what}: check the replicas' health (GET /health)",
                "no_healthy_replica",
                retry_after_s=1,
                request_id=log.request_id,
                client_request_id=log.client_request_id,
            )
        log.error = last_failure.message
        if last_failure.response is not None:
            log.status = str(last_failure.response.status)
            return last_failure.response
        status = 504 if last_failure.reason == "first_token_timeout" else 502
        log.status = str(status)
        return error_response(
            status,
            f"request failed on {len(log.attempts)} replica(s): {last_failure.message}",
            last_failure.reason,
            request_id=log.request_id,
            client_request_id=log.client_request_id,
        )

    async def _attempt(self, request: Request, body: bytes, routed: RoutedRequest, replica: Replica, log: RequestLog) -> Answer:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()  # held: asking per request costs a getpid() each time
        # The request leaves first (on a pooled connection, the common case); the bookkeeping
        # below runs while it travels. Nothing awaits in between, so no other request sees the
        # policy's counts without this one.
        context = request.headers if log.trace is None else log.trace.attempt_began(replica.name, len(log.attempts))
        sent = self.upstream.send("POST", replica.url + request.path, self._upstream_headers(log.request_id, context), body)
        task = asyncio.current_task(loop)
        assert task is not None
        replica.in_flight += 1
        replica.dispatched_total += 1
        replica.breaker.on_dispatch(time.monotonic())
        self.policy.on_dispatch(routed, replica)
        log.replica = replica.name
        log.attempts.append({"replica": replica.name})
        exchange = Exchange(task, self.first_token_timeout_s, loop.time())
        self.watchdog.active.add(exchange)
        outcome = Outcome.FAILED
        upstream: ClientResponse | None = None
        try:
            upstream = await sent.response()
            if log.trace is not None:
                log.trace.answered(upstream.status)
            if upstream.status != 200:
                payload = await upstream.read()
                self._raise_if_retryable(upstream, payload, replica, log)
                replica.record_success()  # a 4xx is the request's fault, not the replica's
                outcome = Outcome.COMPLETED
                return self._passthrough_error(upstream, payload, log)
            if not routed.stream:
                payload = await upstream.read()
                outcome = Outcome.COMPLETED
                return self._unary_response(upstream, payload, replica, routed, log)
            # Armed (relay.py): the stream is set up now, while the engine computes its first
            # token, which then leaves with the client's head from the replica's data_received.
            # Until it does nothing is sent, so what fails before it is retried as below.
            stream = Stream(request, 200, self._stream_headers(upstream, log))
            relay = StreamRelay(
                upstream,
                stream,
                exchange,
                lambda prompt_tokens: self._first_token(routed, replica, prompt_tokens),
                on_start=lambda: self._started(replica, exchange),
                count_events=routed.counts_events,
            )
            outcome = await self._stream(relay, replica, routed, log)
            return stream
        except asyncio.CancelledError:
            if exchange.expired and exchange.phase == FIRST_TOKEN and task.uncancel() == 0:
                self.pool.record_failure(replica)
                raise _RetryableFailure(
                    "first_token_timeout", f"replica {replica.name} sent nothing within {self.first_token_timeout_s:g} s"
                ) from None
            outcome = Outcome.ABANDONED
            log.status = "abandoned"
            raise
        except _RetryableFailure as failure:
            if failure.fault == FAULT_REPLICA:
                self.pool.record_failure(replica)
            else:
                replica.breaker.record_abandoned()  # no verdict (yet): free a probe slot
            raise
        except CONNECTION_ERRORS as err:
            self.pool.record_failure(replica)
            raise _RetryableFailure("connect_error", f"replica {replica.name}: {type(err).__name__}: {err}") from None
        finally:
            if log.trace is not None:  # first: an exception in flight is the attempt's failure
                log.trace.attempt_ended(outcome, exchange.chunks, log.first_byte_mono)
            self.watchdog.active.discard(exchange)
            if upstream is not None:
                if outcome is Outcome.COMPLETED:
                    upstream.release()
                else:
                    upstream.close()  # the engine sees the disconnect and aborts the request
            if outcome is Outcome.ABANDONED:
                replica.breaker.record_abandoned()
            replica.in_flight -= 1
            self.policy.on_finish(routed, replica, outcome)

    def _started(self, replica: Replica, exchange: Exchange) -> None:
        """The client has its first bytes: the replica served, and the watchdog now times chunks."""
        assert self._loop is not None
        exchange.streaming(self.idle_chunk_timeout_s, self._loop.time())
        replica.record_success()

    @staticmethod
    def _stream_headers(upstream: ClientResponse, log: RequestLog) -> dict[str, str]:
        return {
            "Content-Type": upstream.headers.get("content-type", "text/event-stream"),
            "Cache-Control": "no-cache",
            **log.id_headers(),
        }

    def _raise_if_retryable(self, upstream: ClientResponse, payload: bytes, replica: Replica, log: RequestLog) -> None:
        """A replica answered 5xx or 429 before streaming anything: another replica may do better."""
        if upstream.status in RETRYABLE_STATUS:
            raise _RetryableFailure(
                f"upstream_{upstream.status}",
                f"replica {replica.name} answered {upstream.status}",
                response=self._passthrough_error(upstream, payload, log),
                fault=FAULT_UNDECIDED if upstream.status >= 500 else FAULT_NOBODY,
            )

    @staticmethod
    def _passthrough_error(upstream: ClientResponse, payload: bytes, log: RequestLog) -> Response:
        log.status = str(upstream.status)
        log.first_byte_mono = log.finished_mono = time.monotonic()
        return _whole_answer(upstream, payload, log)

    def _unary_response(
        self, upstream: ClientResponse, payload: bytes, replica: Replica, routed: RoutedRequest, log: RequestLog
    ) -> Response:
        replica.record_success()
        self.policy.on_first_token(routed, replica)
        log.first_byte_mono = time.monotonic()
        try:
            log.note_usage(json.loads(payload).get("usage"))
        except (ValueError, AttributeError):
            pass
        log.status = "200"
        return _whole_answer(upstream, payload, log)

    def _first_token(self, routed: RoutedRequest, replica: Replica, prompt_tokens: int | None) -> None:
        """The policy hears "first token" once the engine's prompt count is known (usage in the
        first chunks) or after the second chunk (the first may be only the role preamble)."""
        routed.engine_prompt_tokens = prompt_tokens
        self.policy.on_first_token(routed, replica)

    async def _stream(self, relay: StreamRelay, replica: Replica, routed: RoutedRequest, log: RequestLog) -> Outcome:
        """Pass the stream through (relay.py); end it with an SSE error event if the replica fails.

        Raises what an armed relay's replica failed with before its first payload (retried)."""
        exchange = relay.exchange
        task = exchange.task
        stream = relay.stream
        failure: tuple[int, str, str] | None = None
        try:
            try:
                end = await relay.run()
            finally:
                relay.detach()
                log.first_byte_mono = relay.first_sent_mono or time.monotonic()
            if end is RelayEnd.NOTHING_SENT:  # the replica failed before its first payload: retried
                raise relay.unsent or _RetryableFailure(
                    "closed_before_first_byte", f"replica {replica.name} closed the stream before sending anything"
                )
            if end is RelayEnd.CLIENT_GONE:
                log.status = "abandoned"
                return Outcome.ABANDONED
            if end is RelayEnd.UPSTREAM_FAILED:
                failure = (502, f"replica {replica.name} {relay.error}; the answer is incomplete", "upstream_stream_error")
        except asyncio.CancelledError:
            if exchange.phase == FIRST_TOKEN:  # armed, nothing sent yet: _attempt retries a first-token timeout
                raise
            if not (exchange.expired and task.uncancel() == 0):
                raise
            failure = (504, f"replica {replica.name} stalled: no data for {self.idle_chunk_timeout_s:g} s", "idle_chunk_timeout")
        if relay.first_token_pending:
            self.policy.on_first_token(routed, replica)
        usage = _usage_from_sse_tail(relay.usage_block[-8192:])
        if usage is not None:
            log.note_usage(usage)
        elif relay.events is not None:  # a budget settles from it: events, not pieces (relay.py, EventCounter)
            log.completion_tokens = relay.events.events
        else:
            log.completion_tokens = max(0, exchange.chunks - 2)  # roughly one token per piece, less role and [DONE]
        if failure is None:
            log.status = "200"
            return Outcome.COMPLETED
        self.pool.record_failure(replica)
        log.status, log.error = "stream_error", failure[1]
        try:
            stream.end(relay.cut(sse_error_event(*failure)))
        except ConnectionError:
            pass
        return Outcome.FAILED
