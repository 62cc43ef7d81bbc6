"""The OTLP/HTTP receiver: spans built with opentelemetry-proto decode into the engine's timings."""

from __future__ import annotations

import gzip
import socket

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from vlmserve.bench.engine_traces import TraceReceiver, attach_engine_timings, decode_spans, parse_listen_address
from vlmserve.bench.load import new_traceparent, request_type_of
from vlmserve.errors import UserError
from vlmserve.results.records import RequestRecord

TRACE_ID = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")


def _attribute(key: str, value: float | int | str) -> KeyValue:
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def export_body(trace_id: bytes = TRACE_ID, name: str = "llm_request") -> bytes:
    """One export as vLLM's OTLP/HTTP exporter sends it: a resource, a scope, the span."""
    span = Span(
        trace_id=trace_id,
        span_id=b"\x01" * 8,
        name=name,
        attributes=[
            _attribute("gen_ai.latency.time_to_first_token", 0.25),
            _attribute("gen_ai.latency.time_in_queue", 0.05),
            _attribute("gen_ai.latency.time_in_model_prefill", 0.15),
            _attribute("gen_ai.usage.prompt_tokens", 321),
            _attribute("gen_ai.request.id", "chatcmpl-abc"),
        ],
    )
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])
    return request.SerializeToString()


def test_decode_reads_the_engine_timings_of_an_llm_request_span() -> None:
    [span] = decode_spans(export_body())
    assert span.trace_id == TRACE_ID.hex()
    assert (span.ttft_s, span.queue_s, span.prefill_s, span.prompt_tokens) == (0.25, 0.05, 0.15, 321)
    assert span.request_id == "chatcmpl-abc"


def test_decode_skips_other_spans_and_refuses_what_is_not_otlp() -> None:
    assert decode_spans(export_body(name="model_forward")) == []
    with pytest.raises(ValueError, match="not an OTLP trace export"):
        decode_spans(b"\xff\xff\xff not protobuf")


def test_attach_fills_the_record_sent_with_that_trace_id() -> None:
    spans = {span.trace_id: span for span in decode_spans(export_body())}
    matched = RequestRecord("a", 0.0, 0.0, trace_id=TRACE_ID.hex())
    other = RequestRecord("b", 0.0, 0.0, trace_id="f" * 32)
    untraced = RequestRecord("c", 0.0, 0.0)
    assert attach_engine_timings([matched, other, untraced], spans) == 1
    assert (matched.engine_ttft_s, matched.engine_queue_s, matched.engine_prefill_s) == (0.25, 0.05, 0.15)
    assert other.engine_ttft_s is None and untraced.engine_ttft_s is None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_receiver_answers_otlp_posts_and_waits_for_the_spans_it_expects() -> None:
    receiver = TraceReceiver("127.0.0.1", _free_port())
    await receiver.start()
    try:
        assert receiver.url.endswith("/v1/traces")
        async with aiohttp.ClientSession() as session:
            headers = {"Content-Type": "application/x-protobuf"}
            async with session.post(receiver.url, data=export_body(), headers=headers) as response:
                assert response.status == 200
            zipped = gzip.compress(export_body(trace_id=b"\x02" * 16))
            async with session.post(receiver.url, data=zipped, headers={**headers, "Content-Encoding": "gzip"}) as response:
                assert response.status == 200
            async with session.post(receiver.url, data=b"\xff\xff garbage", headers=headers) as response:
                assert response.status == 400
        assert await receiver.wait_for([TRACE_ID.hex(), (b"\x02" * 16).hex()], timeout_s=1.0) == 0
        assert await receiver.wait_for(["e" * 32], timeout_s=0.05) == 1
        assert receiver.rejected == 1
    finally:
        await receiver.stop()


def test_traceparent_is_fresh_sampled_and_well_formed() -> None:
    first, header = new_traceparent()
    second, _ = new_traceparent()
    assert first != second and len(first) == 32
    version, trace_id, span_id, flags = header.decode().removeprefix("traceparent: ").strip().split("-")
    assert (version, trace_id, len(span_id), flags) == ("00", first, 16, "01")


def test_request_type_follows_the_images_a_text_turn_carries() -> None:
    assert request_type_of("text", 0) == "text"
    assert request_type_of("text", 1) == "image"
    assert request_type_of("text", 3) == "multi-image"
    assert request_type_of("video", 0) == "video"


@pytest.mark.parametrize(
    "text, message",
    [
        ("4318", "--engine-traces: '4318' is not HOST:PORT; write it like 127.0.0.1:4318"),
        ("localhost:99999", "--engine-traces: port 99999 is out of range (1-65535)"),
        ("http://x:1/v1/traces", "--engine-traces: 'http://x:1/v1/traces' is not HOST:PORT; write it like 127.0.0.1:4318"),
    ],
)
def test_listen_address_refuses_what_is_not_host_port(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_listen_address(text)
    assert caught.value.message == message


def test_listen_address_accepts_ipv6_brackets() -> None:
    assert parse_listen_address("[::1]:4318") == ("::1", 4318)
    assert parse_listen_address("127.0.0.1:4318") == ("127.0.0.1", 4318)
