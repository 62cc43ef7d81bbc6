"""The engine's own per-request timings, from the OpenTelemetry spans vLLM exports.

Why spans: vLLM's /metrics histograms give a run's means only, but where one image request's
time goes (queue, prefill with the vision encoder, the engine's input processing) is in the
"llm_request" span it exports per request when started with `--otlp-traces-endpoint`. With
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf it POSTs OTLP/HTTP protobuf to that URL;
this module is the small receiver for it (it keeps every span too when asked: the tests read the
gateway's spans and the engine's, joined in one trace, from it). The bench sends each request with its own W3C
`traceparent`, so the span joins that trace and its trace id names the bench's record.

Spans arrive in batches (vLLM's batch span processor; OTEL_BSP_SCHEDULE_DELAY, 5 s by default,
200 ms as vlmserve's launcher starts a tracing engine), so after the load the bench waits briefly
for the last batch (`TraceReceiver.wait_for`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from vlmserve.errors import UserError
from vlmserve.observe.tracing import OTLP_TRACES_PATH as TRACES_PATH
from vlmserve.results.records import RequestRecord

SPAN_NAME = "llm_request"
TTFT = "gen_ai.latency.time_to_first_token"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
REQUEST_ID = "gen_ai.request.id"
MAX_EXPORT_BYTES = 32 * 1024 * 1024
"""One export request's largest body: spans are small, a bigger POST is not vLLM's."""

_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class EngineSpan:
    """One request as the engine timed it (seconds, on the engine's clock)."""

    trace_id: str
    request_id: str | None
    ttft_s: float | None
    queue_s: float | None
    prefill_s: float | None
    prompt_tokens: int | None


@dataclass(frozen=True)
class ReceivedSpan:
    """Any exported span, as a trace viewer shows it: where it sits in its trace, what it is, who sent it."""

    trace_id: str
    span_id: str
    parent_span_id: str | None  # None: the trace's root
    name: str
    kind: int  # OTLP's SpanKind number: 1 internal, 2 server, 3 client
    service: str | None  # the resource's service.name
    attributes: dict[str, float | int | str | None]
    events: tuple[str, ...]
    status: int  # OTLP's StatusCode number: 0 unset, 1 ok, 2 error


def parse_listen_address(text: str) -> tuple[str, int]:
    """'127.0.0.1:4318' (or '[::1]:4318') to (host, port); a one-line UserError otherwise."""
    match = _ADDRESS.match(text.strip())
    if not match:
        raise UserError(f"--engine-traces: '{text}' is not HOST:PORT; write it like 127.0.0.1:4318")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise UserError(f"--engine-traces: port {port} is out of range (1-65535)")
    return match.group("host").strip("[]"), port


def _export_request_class() -> Any:
    """ExportTraceServiceRequest, imported only when traces are asked for (it comes with vLLM)."""
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:
        raise UserError(
            "--engine-traces needs the opentelemetry-proto package (vLLM installs it); pip install opentelemetry-proto"
        ) from None
    return ExportTraceServiceRequest


class _OtlpAnyValue(Protocol):
    """OTLP's AnyValue message: one of several typed fields is set."""

    def WhichOneof(self, oneof_group: str) -> str | None: ...


def _value(any_value: _OtlpAnyValue) -> float | int | str | None:
    kind = any_value.WhichOneof("value")
    if kind in ("double_value", "int_value", "string_value", "bool_value"):
        value: float | int | str | None = getattr(any_value, kind)
        return value
    return None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _export_request(payload: bytes) -> Any:
    request = _export_request_class()()
    try:
        request.ParseFromString(payload)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError has no stable import path
        raise ValueError(f"not an OTLP trace export: {err}") from None
    return request


def decode_all_spans(payload: bytes) -> list[ReceivedSpan]:
    """Every span in one OTLP/HTTP protobuf export body (ValueError if it is not one)."""
    spans: list[ReceivedSpan] = []
    for resource_spans in _export_request(payload).resource_spans:
        service = next((_value(item.value) for item in resource_spans.resource.attributes if item.key == "service.name"), None)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=int(span.kind),
                        service=None if service is None else str(service),
                        attributes={item.key: _value(item.value) for item in span.attributes},
                        events=tuple(event.name for event in span.events),
                        status=int(span.status.code),
                    )
                )
    return spans


def decode_spans(payload: bytes) -> list[EngineSpan]:
    """The "llm_request" spans in one OTLP/HTTP protobuf export body (ValueError if it is not one)."""
    request = _export_request(payload)
    spans: list[EngineSpan] = []
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if span.name != SPAN_NAME:
                    continue
                attributes = {item.key: _value(item.value) for item in span.attributes}
                prompt_tokens = attributes.get(PROMPT_TOKENS)
                request_id = attributes.get(REQUEST_ID)
                spans.append(
                    EngineSpan(
                        trace_id=span.trace_id.hex(),
                        request_id=None if request_id is None else str(request_id),
                        ttft_s=_float(attributes.get(TTFT)),
                        queue_s=_float(attributes.get(QUEUE)),
                        prefill_s=_float(attributes.get(PREFILL)),
                        prompt_tokens=int(prompt_tokens) if isinstance(prompt_tokens, (int, float)) else None,
                    )
                )
    return spans


class TraceReceiver:
    """An OTLP/HTTP trace endpoint that keeps each engine span by its trace id."""

    def __init__(self, host: str, port: int, keep_all: bool = False) -> None:
        _export_request_class()  # a missing package is the user's to fix before the run, not after it
        self.host, self.port = host, port
        self.spans: dict[str, EngineSpan] = {}
        self.received: list[ReceivedSpan] | None = [] if keep_all else None  # every span, in arrival order
        self.exports = 0
        self.rejected = 0
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """What the engine's `--otlp-traces-endpoint` must be."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{TRACES_PATH}"

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_EXPORT_BYTES)
        app.router.add_post(TRACES_PATH, self._export)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as err:
            await runner.cleanup()
            raise UserError(f"--engine-traces: cannot listen on {self.host}:{self.port} ({err.strerror or err})") from None
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp has undone a gzip Content-Encoding already
        try:
            spans = decode_spans(body)
        except ValueError:
            self.rejected += 1
            return web.Response(status=400, text="not an OTLP/HTTP protobuf trace export")
        self.exports += 1
        for span in spans:
            self.spans[span.trace_id] = span
        if self.received is not None:
            self.received.extend(decode_all_spans(body))
        self._arrived.set()
        # an empty ExportTraceServiceResponse: zero bytes of protobuf
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    async def wait_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `done()` holds (checked as each export arrives) or `timeout_s` passed; returns done()."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                pass
        return True

    async def wait_for(self, trace_ids: Iterable[str], timeout_s: float) -> int:
        """Wait until every trace id has its span or `timeout_s` passed; returns how many are missing."""
        wanted = set(trace_ids)
        deadline = time.monotonic() + timeout_s
        while True:
            missing = len(wanted - self.spans.keys())
            left = deadline - time.monotonic()
            if missing == 0 or left <= 0:
                return missing
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                pass


def attach_engine_timings(records: Iterable[RequestRecord], spans: dict[str, EngineSpan]) -> int:
    """Copy each span's timings into the record sent with its trace id; returns how many matched."""
    matched = 0
    for record in records:
        span = spans.get(record.trace_id) if record.trace_id else None
        if span is None:
            continue
        record.engine_ttft_s, record.engine_queue_s, record.engine_prefill_s = span.ttft_s, span.queue_s, span.prefill_s
        matched += 1
    return matched
