"""The gateway's OpenTelemetry spans (observe/tracing.py), end to end in one process: a real gateway on a
loopback port, scripted replicas on real sockets, and the project's OTLP/HTTP receiver (bench/engine_traces.py)
that the SDK's exporter POSTs to from its own thread. What is checked is what a trace viewer would show:
one trace per request, the spans' parent links, their attributes, and the context the replica was sent."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway
from tests.helpers.procs import free_port
from tests.helpers.relay_harness import SSE_HEAD, ScriptedReplica, frame, scripted_replica, send, token
from vlmserve.bench.engine_traces import ReceivedSpan, TraceReceiver
from vlmserve.deploy.front_door import check_gateway_files, gateway_argv
from vlmserve.errors import UserError
from vlmserve.gateway.config import GatewayConfig
from vlmserve.observe.tracing import ADMISSION_SPAN, ATTEMPT_SPAN, QUEUE_SPAN, RELAY_SPAN, traces_url
from vlmserve.spec import DeploymentSpec

SERVER, CLIENT = 2, 3  # OTLP span kinds
ERROR = 2  # OTLP status code
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
_TRACEPARENT = re.compile(r"^traceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\r?$", re.M | re.I)


def streamed(pause_s: float = 0.0):
    """A replica's streamed answer: three tokens, usage, [DONE]."""

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, frame(token("a")), frame(token("b")))
        if pause_s:
            await asyncio.sleep(pause_s)
        await send(
            writer,
            frame(token("c", usage={"prompt_tokens": 5, "completion_tokens": 3})),
            frame(b"data: [DONE]\n\n"),
            b"0\r\n\r\n",
        )

    return script


async def refused_503(writer: asyncio.StreamWriter) -> None:
    body = b'{"error": {"message": "overloaded"}}'
    await send(
        writer,
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )


@asynccontextmanager
async def receiver() -> AsyncIterator[TraceReceiver]:
    sink = TraceReceiver("127.0.0.1", free_port(), keep_all=True)
    await sink.start()
    try:
        yield sink
    finally:
        await sink.stop()


def sent_context(replica: ScriptedReplica, index: int = 0) -> tuple[str, str, bool] | None:
    """The traceparent the replica's `index`-th POST carried: trace id, parent span id, sampled flag (the
    SDK also sets W3C level 2's random-trace-id flag, 02)."""
    match = _TRACEPARENT.search(replica.heads[index])
    return None if match is None else (match.group(1), match.group(2), bool(int(match.group(3), 16) & 1))


async def traced_request(
    replicas: list[ScriptedReplica], headers: dict[str, str] | None = None, **settings: Any
) -> tuple[list[ReceivedSpan], int]:
    """One streamed chat request through a traced gateway; the spans it exported (the gateway stopped:
    its last batch flushed) and the client's status."""
    async with receiver() as sink:
        async with running_gateway([r.url for r in replicas], otlp_traces_endpoint=sink.url, **settings) as gateway:
            async with aiohttp.ClientSession() as session:
                result = await post_chat(session, gateway.base_url, chat_body("hi"), headers=headers)
        assert sink.received is not None
        return list(sink.received), result.status


def by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


async def test_a_request_yields_one_trace_of_server_admission_attempt_and_relay_spans() -> None:
    async with scripted_replica(streamed(), keep_alive=True) as replica:
        spans, status = await traced_request([replica])
    assert status == 200
    assert len({span.trace_id for span in spans}) == 1, spans
    named = by_name(spans)
    [server] = named["POST /v1/chat/completions"]
    [admission], [attempt], [relay] = named[ADMISSION_SPAN], named[ATTEMPT_SPAN], named[RELAY_SPAN]
    assert QUEUE_SPAN not in named  # no --max-in-flight: nothing waited
    assert server.kind == SERVER and server.parent_span_id is None and server.service == "vlmserve-gateway"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.request.model"] == "sim-model"
    assert server.attributes["gen_ai.usage.output_tokens"] == 3 and server.attributes["vlmserve.retries"] == 0
    assert admission.parent_span_id == server.span_id
    assert admission.attributes["vlmserve.admission.outcome"] == "admitted"
    assert admission.attributes["vlmserve.admission.queued"] is False  # bool_value reads back as a bool
    assert attempt.kind == CLIENT and attempt.parent_span_id == server.span_id
    assert attempt.attributes["vlmserve.replica"] == replica.url.removeprefix("http://")
    assert attempt.attributes["vlmserve.attempt"] == 0 and attempt.attributes["http.response.status_code"] == 200
    assert relay.parent_span_id == attempt.span_id and "first_byte" in relay.events
    assert relay.attributes["vlmserve.relay.chunks"] >= 1  # type: ignore[operator]  # pieces as TCP delivered them
    # the replica was sent the attempt's own context: the engine's span becomes the attempt's child
    assert sent_context(replica) == (server.trace_id, attempt.span_id, True)


async def test_spans_leave_on_the_exporters_own_thread_never_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exported_on: list[threading.Thread] = []
    real_export = OTLPSpanExporter.export

    def export(self: OTLPSpanExporter, spans: Any) -> Any:
        exported_on.append(threading.current_thread())
        return real_export(self, spans)

    monkeypatch.setattr(OTLPSpanExporter, "export", export)
    async with scripted_replica(streamed(), keep_alive=True) as replica:
        spans, _ = await traced_request([replica])
    assert len(spans) == 4 and exported_on
    assert threading.main_thread() not in exported_on  # the event loop runs on the main thread here


async def test_a_clients_traceparent_is_honoured() -> None:
    async with scripted_replica(streamed(), keep_alive=True) as replica:
        spans, _ = await traced_request([replica], {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    [server] = by_name(spans)["POST /v1/chat/completions"]
    assert {span.trace_id for span in spans} == {CLIENT_TRACE}
    assert server.parent_span_id == CLIENT_SPAN
    [attempt] = by_name(spans)[ATTEMPT_SPAN]
    assert sent_context(replica) == (CLIENT_TRACE, attempt.span_id, True)


@pytest.mark.hostile(
    "a malformed traceparent from a client (bad version, short ids, all-zero trace id): ignored, "
    "the gateway starts a new trace and never forwards it"
)
@pytest.mark.parametrize(
    "bad",
    [
        "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01;evil",
    ],
)
async def test_a_malformed_traceparent_starts_a_new_trace(bad: str) -> None:
    async with scripted_replica(streamed(), keep_alive=True) as replica:
        spans, status = await traced_request([replica], {"traceparent": bad})
    assert status == 200
    [server] = by_name(spans)["POST /v1/chat/completions"]
    assert server.parent_span_id is None and server.trace_id != CLIENT_TRACE
    assert len({span.trace_id for span in spans}) == 1
    assert bad not in replica.heads[0]
    context = sent_context(replica)
    assert context is not None and context[0] == server.trace_id


async def test_each_attempt_is_a_span_and_a_retry_names_the_failure() -> None:
    answered: list[int] = []

    async def first_busy(writer: asyncio.StreamWriter) -> None:  # whichever replica is tried first answers 503
        answered.append(503 if not answered else 200)
        await (refused_503(writer) if answered[-1] == 503 else streamed()(writer))

    async with scripted_replica(first_busy, keep_alive=True) as one, scripted_replica(first_busy, keep_alive=True) as other:
        spans, status = await traced_request([one, other])
    assert status == 200 and answered == [503, 200]
    named = by_name(spans)
    [server] = named["POST /v1/chat/completions"]
    first, second = sorted(named[ATTEMPT_SPAN], key=lambda span: int(span.attributes["vlmserve.attempt"] or 0))
    assert (first.attributes["vlmserve.attempt"], second.attributes["vlmserve.attempt"]) == (0, 1)
    assert first.parent_span_id == second.parent_span_id == server.span_id
    assert first.attributes["http.response.status_code"] == 503 and first.attributes["error.type"] == "upstream_503"
    assert first.status == ERROR and second.status != ERROR
    busy, good = (one, other) if first.attributes["vlmserve.replica"] == one.url.removeprefix("http://") else (other, one)
    assert second.attributes["vlmserve.replica"] == good.url.removeprefix("http://")
    assert server.attributes["vlmserve.retries"] == 1 and server.status != ERROR
    # each replica was sent its own attempt's context
    assert sent_context(busy) == (server.trace_id, first.span_id, True)
    assert sent_context(good) == (server.trace_id, second.span_id, True)


async def test_a_request_that_waits_for_a_slot_has_a_queue_span() -> None:
    async with scripted_replica(streamed(pause_s=0.3), streamed(), keep_alive=True) as replica, receiver() as sink:
        async with running_gateway([replica.url], otlp_traces_endpoint=sink.url, max_in_flight=1) as gateway:
            async with aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(post_chat(session, gateway.base_url, chat_body("hi")) for _ in range(2)))
        spans = list(sink.received or [])
    assert [result.status for result in results] == [200, 200]
    assert len({span.trace_id for span in spans}) == 2
    [queue] = by_name(spans)[QUEUE_SPAN]
    admission = next(span for span in spans if span.span_id == queue.parent_span_id)
    assert admission.name == ADMISSION_SPAN and admission.attributes["vlmserve.admission.queued"] is True
    assert queue.attributes["vlmserve.priority"] == "interactive"


async def test_a_refused_request_ends_its_admission_span_with_the_refusal() -> None:
    async with scripted_replica(keep_alive=True) as replica, receiver() as sink:
        async with running_gateway([replica.url], otlp_traces_endpoint=sink.url) as gateway:
            async with aiohttp.ClientSession() as session:
                result = await post_chat(session, gateway.base_url, b"{not json")
        spans = list(sink.received or [])
    assert result.status == 400 and replica.posts == 0
    named = by_name(spans)
    [admission], [server] = named[ADMISSION_SPAN], named["POST /v1/chat/completions"]
    assert admission.attributes["vlmserve.admission.outcome"] == "400"
    assert server.attributes["http.response.status_code"] == 400 and server.status != ERROR  # the client's fault
    assert ATTEMPT_SPAN not in named


async def test_ratio_zero_exports_no_new_trace_but_follows_a_sampled_parent() -> None:
    async with scripted_replica(streamed(), streamed(), keep_alive=True) as replica, receiver() as sink:
        async with running_gateway([replica.url], otlp_traces_endpoint=sink.url, trace_sample_ratio=0.0) as gateway:
            async with aiohttp.ClientSession() as session:
                await post_chat(session, gateway.base_url, chat_body("hi"))
                await post_chat(
                    session, gateway.base_url, chat_body("hi"), headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
                )
        spans = list(sink.received or [])
    assert spans and {span.trace_id for span in spans} == {CLIENT_TRACE}  # only the client's sampled trace
    unsampled = sent_context(replica, 0)
    assert unsampled is not None and unsampled[2] is False  # the engine is told: not sampled
    assert sent_context(replica, 1) == (CLIENT_TRACE, sent_context(replica, 1)[1], True)  # type: ignore[index]


async def test_tracing_off_builds_nothing_and_forwards_the_clients_context() -> None:
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    async with scripted_replica(streamed(), keep_alive=True) as replica:
        async with running_gateway([replica.url]) as gateway:
            assert gateway.gateway.tracing is None
            async with aiohttp.ClientSession() as session:
                result = await post_chat(session, gateway.base_url, chat_body("hi"), headers={"traceparent": traceparent})
    assert result.status == 200
    assert sent_context(replica) == (CLIENT_TRACE, CLIENT_SPAN, True)


@pytest.mark.parametrize(
    ("endpoint", "ratio", "message"),
    [
        ("grpc://collector:4317", 1.0, "is not an OTLP/HTTP URL"),
        ("collector:4318", 1.0, "is not an OTLP/HTTP URL"),
        ("http://", 1.0, "is not an OTLP/HTTP URL"),
        ("http://collector:99999/v1/traces", 1.0, "out of range"),
        ("http://collector:4318/v1/traces?x=1", 1.0, "no query"),
        ("http://collector:4318/v1/traces", 1.5, "--trace-sample-ratio must be between 0 and 1"),
        ("http://collector:4318/v1/traces", float("nan"), "--trace-sample-ratio must be between 0 and 1"),
        (None, -0.1, "--trace-sample-ratio must be between 0 and 1"),
    ],
)
def test_bad_tracing_settings_are_one_line_errors(endpoint: str | None, ratio: float, message: str) -> None:
    config = GatewayConfig(replicas=["http://127.0.0.1:8001"], otlp_traces_endpoint=endpoint, trace_sample_ratio=ratio)
    with pytest.raises(UserError, match=re.escape(message)) as raised:
        config.validate()
    assert "\n" not in str(raised.value)


def test_an_endpoint_without_a_path_gets_otlps_trace_path() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://collector/custom/traces") == "https://collector/custom/traces"


def test_the_spec_carries_tracing_to_the_gateways_command_line(tmp_path: Path) -> None:
    spec = DeploymentSpec(gateway_otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces", gateway_trace_sample_ratio=0.25)
    check_gateway_files(spec)
    argv = gateway_argv(spec, ["http://127.0.0.1:8001"])
    assert argv[argv.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4318/v1/traces"
    assert argv[argv.index("--trace-sample-ratio") + 1] == "0.25"
    assert "--otlp-traces-endpoint" not in gateway_argv(DeploymentSpec(), ["http://127.0.0.1:8001"])
    with pytest.raises(UserError, match=r"^gateway_otlp_traces_endpoint: --otlp-traces-endpoint 'udp://x:1'"):
        check_gateway_files(DeploymentSpec(gateway_otlp_traces_endpoint="udp://x:1"))


def test_tracing_without_the_sdk_installed_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:  # as on a core install: no opentelemetry-sdk, no exporter
        return None if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")) else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    config = GatewayConfig(replicas=["http://127.0.0.1:8001"], otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces")
    with pytest.raises(UserError, match=r"pip install 'vlmserve\[tracing\]'$"):
        config.validate()
    GatewayConfig(replicas=["http://127.0.0.1:8001"]).validate()  # tracing off: the SDK is not needed
