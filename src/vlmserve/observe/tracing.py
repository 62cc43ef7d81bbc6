"""The gateway's OpenTelemetry spans: what a request did between the client and the engine.

Why: vLLM exports one `llm_request` span per request, but without the gateway's own spans a trace
shows nothing of admission, queueing, retries or which replica was chosen — the part an audit
trail needs. With `--otlp-traces-endpoint` (vLLM's own flag name) the gateway exports, per request:

    POST /v1/chat/completions        SERVER   the whole request, as the client saw it
    ├── gateway.admission                     parse, tenant, media checks, rate limits, a slot
    │   └── gateway.queue                     only when the request waited for a slot
    └── gateway.attempt              CLIENT   one per replica tried (retries are siblings)
        ├── gateway.relay                     the replica's answer passed to the client
        └── llm_request              (vLLM)   the engine's span: the attempt's context is what
                                              the gateway forwards as `traceparent`

An incoming W3C `traceparent` is honoured (the spans join the client's trace; a malformed one is
ignored: a new trace). Sampling is parent-based with a ratio for new traces (`--trace-sample-ratio`);
an unsampled request still forwards its context (flag 00), so the engine leaves it out too.

Nothing slow runs on the event loop: the SDK's BatchSpanProcessor only queues an ended span (a
deque append); encoding and the OTLP/HTTP POST happen on its own worker thread, and shutdown's
last flush runs on a thread of its own. The OpenTelemetry SDK is an optional extra
(`pip install 'vlmserve[tracing]'`): it is imported only when tracing is on, and when it is off
the gateway's hooks cost one attribute check each.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from vlmserve.errors import UserError

if TYPE_CHECKING:  # the SDK is optional (imported only when tracing is on)
    from opentelemetry.trace import Span

SpanAttributes = dict[str, str | bool | int | float]
"""The attribute values the gateway sets on its spans (a subset of OpenTelemetry's AttributeValue)."""

log = logging.getLogger("vlmserve.gateway")

OTLP_TRACES_ENDPOINT_FLAG = "--otlp-traces-endpoint"
TRACE_SAMPLE_RATIO_FLAG = "--trace-sample-ratio"
DEFAULT_TRACE_SAMPLE_RATIO = 1.0
"""Every new trace is sampled unless the operator lowers it (OpenTelemetry's own default sampler)."""
OTLP_TRACES_PATH = "/v1/traces"
"""OTLP/HTTP's trace path: added to an endpoint given without a path (http://collector:4318)."""
SERVICE_NAME = "vlmserve-gateway"
"""The exported spans' service.name, unless OTEL_SERVICE_NAME says otherwise."""
SHUTDOWN_WAIT_S = 5.0
"""How long stopping the gateway waits for the last spans to leave (a collector that is down)."""

# Span names and the attributes the gateway sets (docs/gateway.md, "Tracing", lists them).
ADMISSION_SPAN = "gateway.admission"
QUEUE_SPAN = "gateway.queue"
ATTEMPT_SPAN = "gateway.attempt"
RELAY_SPAN = "gateway.relay"
_REQUIRED_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


def check_tracing_settings(endpoint: str | None, ratio: float) -> None:
    """Refuse an endpoint or ratio that cannot work, in one line, before anything starts."""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and 0.0 <= ratio <= 1.0):
        raise UserError(f"{TRACE_SAMPLE_RATIO_FLAG} must be between 0 and 1 (the share of new traces kept), got {ratio}")
    if endpoint is None:
        return
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError as err:
        raise UserError(f"{OTLP_TRACES_ENDPOINT_FLAG} {endpoint!r}: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in endpoint):
        raise UserError(
            f"{OTLP_TRACES_ENDPOINT_FLAG} {endpoint!r} is not an OTLP/HTTP URL: the gateway exports "
            f"OTLP/HTTP protobuf; write it like http://127.0.0.1:4318{OTLP_TRACES_PATH}"
        )
    if port == 0 or parts.query or parts.fragment:
        raise UserError(
            f"{OTLP_TRACES_ENDPOINT_FLAG} {endpoint!r}: give a collector's URL with a port from 1 to "
            f"65535 and no query, like http://127.0.0.1:4318{OTLP_TRACES_PATH}"
        )
    missing = [name for name in _REQUIRED_MODULES if not _importable(name)]
    if missing:
        raise UserError(
            f"{OTLP_TRACES_ENDPOINT_FLAG} needs the OpenTelemetry SDK and its OTLP/HTTP exporter "
            f"({', '.join(missing)} not installed): pip install 'vlmserve[tracing]'"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def traces_url(endpoint: str) -> str:
    """The URL the exporter POSTs to: the endpoint as given, or with OTLP's trace path when it has none."""
    return endpoint if urlsplit(endpoint).path not in ("", "/") else endpoint.rstrip("/") + OTLP_TRACES_PATH


class FinishedRequest(Protocol):
    """What the server span reads of a finished request (the gateway's RequestLog)."""

    request_id: str
    status: str
    tenant: str
    model: str | None
    stream: bool
    priority: str
    replica: str
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None

    @property
    def retries(self) -> int: ...


def gateway_tracing(endpoint: str | None, ratio: float) -> GatewayTracing | None:
    """The gateway's tracing, or None when no endpoint is set (tracing off: nothing imported)."""
    return None if endpoint is None else GatewayTracing(endpoint, ratio)


class GatewayTracing:
    """One gateway process's tracer provider, sampler and exporter (never the global provider, so that
    several gateways in one process, as in tests, each export their own spans)."""

    def __init__(self, endpoint: str, ratio: float) -> None:
        check_tracing_settings(endpoint, ratio)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        self.endpoint = endpoint
        self.provider = TracerProvider(
            sampler=ParentBasedTraceIdRatio(ratio),
            resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME}),
        )
        self.provider.add_span_processor(BatchSpanProcessor(exporter))  # exports on its own thread
        self.tracer = self.provider.get_tracer("vlmserve.gateway")
        self.propagator = TraceContextTextMapPropagator()
        self.in_context = set_span_in_context
        self.server_kind, self.client_kind = SpanKind.SERVER, SpanKind.CLIENT

    def begin(self, method: str, path: str, headers: Mapping[str, str]) -> RequestTrace:
        """A request arrived: its server span (in the client's trace when it sent a valid traceparent)
        and its admission span start now."""
        carrier = {name: value for name in ("traceparent", "tracestate") if (value := headers.get(name))}
        parent = self.propagator.extract(carrier) if carrier else None  # malformed: empty, a new trace
        server = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self.server_kind,
            attributes={"http.request.method": method, "url.path": path},
        )
        return RequestTrace(self, server)

    async def close(self) -> None:
        """Flush and stop the exporter on a thread of its own, waiting at most SHUTDOWN_WAIT_S."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def settle() -> None:
            if not done.done():
                done.set_result(None)

        def shut_down() -> None:
            try:
                self.provider.shutdown()
            finally:
                try:
                    loop.call_soon_threadsafe(settle)
                except RuntimeError:  # the loop closed first
                    pass

        threading.Thread(target=shut_down, name="otel-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done, SHUTDOWN_WAIT_S)
        except TimeoutError:
            log.warning("trace spans not all exported to %s within %.0f s of stopping", self.endpoint, SHUTDOWN_WAIT_S)


class RequestTrace:
    """The spans of one request, opened and closed by the gateway's hooks (app.py, proxy.py)."""

    __slots__ = ("tracing", "server", "admission", "queue", "attempt", "relay", "relay_started_mono")

    def __init__(self, tracing: GatewayTracing, server: Span) -> None:
        self.tracing = tracing
        self.server = server
        self.admission: Span | None = tracing.tracer.start_span(ADMISSION_SPAN, context=tracing.in_context(server))
        self.queue: Span | None = None
        self.attempt: Span | None = None
        self.relay: Span | None = None
        self.relay_started_mono = 0.0

    def queued(self, priority: str) -> None:
        """No slot was free: the request waits in its priority's admission queue."""
        tracing, admission = self.tracing, self.admission
        assert admission is not None, "queued after admission ended"
        self.queue = tracing.tracer.start_span(
            QUEUE_SPAN, context=tracing.in_context(admission), attributes={"vlmserve.priority": priority}
        )

    def admitted(self, tenant: str, priority: str) -> None:
        """The request holds a slot: admission (and its wait in the queue, if any) ends."""
        if self.queue is not None:
            self.queue.end()
        admission = self.admission
        assert admission is not None, "admitted twice"
        admission.set_attributes(
            {
                "vlmserve.tenant": tenant,
                "vlmserve.priority": priority,
                "vlmserve.admission.queued": self.queue is not None,
                "vlmserve.admission.outcome": "admitted",
            }
        )
        admission.end()
        self.admission = None

    def attempt_began(self, replica: str, number: int) -> dict[str, str]:
        """An attempt on `replica` (0: the first, 1: the first retry...) starts; returns the trace context
        the gateway forwards to the engine: this attempt's, so the engine's span is its child."""
        tracing = self.tracing
        self.attempt = attempt = tracing.tracer.start_span(
            ATTEMPT_SPAN,
            context=tracing.in_context(self.server),
            kind=tracing.client_kind,
            attributes={"vlmserve.replica": replica, "vlmserve.attempt": number},
        )
        carrier: dict[str, str] = {}
        tracing.propagator.inject(carrier, context=tracing.in_context(attempt))
        return carrier

    def answered(self, status: int) -> None:
        """The replica's answer head arrived: its status, and the relay of its body starts."""
        tracing, attempt = self.tracing, self.attempt
        assert attempt is not None, "an answer without an attempt"
        attempt.set_attribute("http.response.status_code", status)
        self.relay = tracing.tracer.start_span(RELAY_SPAN, context=tracing.in_context(attempt))
        self.relay_started_mono = time.monotonic()

    def attempt_ended(self, outcome: str, chunks: int, first_byte_mono: float | None) -> None:
        """The attempt is over (called from its `finally`: an exception in flight is its failure)."""
        error = sys.exc_info()[1] if outcome != "completed" else None
        relay = self.relay
        if relay is not None:
            attributes: SpanAttributes = {"vlmserve.relay.chunks": chunks}
            if first_byte_mono is not None and first_byte_mono >= self.relay_started_mono:
                ago_ns = int((time.monotonic() - first_byte_mono) * 1e9)
                relay.add_event("first_byte", timestamp=time.time_ns() - ago_ns)
                attributes["vlmserve.relay.first_byte_ms"] = round((first_byte_mono - self.relay_started_mono) * 1e3, 3)
            relay.set_attributes(attributes)
            relay.end()
            self.relay = None
        attempt = self.attempt
        assert attempt is not None, "an attempt ended that never began"
        attempt.set_attribute("vlmserve.outcome", outcome)
        reason = None if error is None else getattr(error, "reason", None) or type(error).__name__
        if reason is not None:
            attempt.set_attribute("error.type", reason)
        if outcome == "failed" or (reason is not None and reason != "CancelledError"):  # a client gone is no error
            _set_error(attempt, getattr(error, "message", None) or reason or outcome)
        attempt.end()
        self.attempt = None

    def finish(self, request: FinishedRequest) -> None:
        """The request is answered (or refused, or abandoned): the server span ends with what it did."""
        status = request.status
        if self.admission is not None:  # refused before a slot (or failed inside the gateway)
            self.admission.set_attributes({"vlmserve.admission.outcome": status, "vlmserve.tenant": request.tenant})
            if self.queue is not None:
                self.queue.end()
            self.admission.end()
            self.admission = None
        server = self.server
        attributes: SpanAttributes = {
            "vlmserve.request_id": request.request_id,
            "vlmserve.tenant": request.tenant,
            "vlmserve.stream": request.stream,
            "vlmserve.priority": request.priority,
            "vlmserve.replica": request.replica,
            "vlmserve.retries": request.retries,
            "vlmserve.outcome": status,
        }
        if request.model is not None:
            attributes["gen_ai.request.model"] = request.model
        if request.prompt_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = request.prompt_tokens
        if request.completion_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = request.completion_tokens
        code = int(status) if status.isdigit() else None
        if code is not None:
            attributes["http.response.status_code"] = code
        server.set_attributes(attributes)
        if (code is not None and code >= 500) or status == "stream_error":  # a 4xx is the client's, not an error here
            _set_error(server, request.error or status)
        server.end()


def _set_error(span: Span, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description[:256]))
