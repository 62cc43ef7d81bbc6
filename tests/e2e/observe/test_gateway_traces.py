"""One request through the gateway to the real embedded vLLM engine is one trace: the gateway's spans and
the engine's `llm_request`, joined by the context the gateway forwards, in a real OTLP/HTTP receiver.

The shared session engine already exports its spans (`--otlp-traces-endpoint`, OTLP/HTTP, a 200 ms flush:
tests/helpers/engine.py) to a sink that drops them; this test frees that port and listens there with the
project's receiver (bench/engine_traces.py), and points a traced gateway at the same receiver, so no
second engine is started for it.
"""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI

from tests.helpers.gateway_fixtures import running_gateway
from vlmserve.bench.engine_traces import SPAN_NAME, ReceivedSpan, TraceReceiver
from vlmserve.observe.tracing import ADMISSION_SPAN, ATTEMPT_SPAN, RELAY_SPAN, SERVICE_NAME

SERVER_SPAN = "POST /v1/chat/completions"


async def one_traced_request(engine, port: int) -> tuple[str, list[ReceivedSpan]]:
    """The OpenAI SDK's streamed chat request through a traced gateway; its answer and every span received."""
    receiver = TraceReceiver("127.0.0.1", port, keep_all=True)
    await receiver.start()
    try:
        async with running_gateway([engine.base_url], otlp_traces_endpoint=receiver.url) as gateway:
            client = AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model=engine.model,
                    messages=[{"role": "user", "content": "Name a colour."}],
                    max_tokens=8,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
            finally:
                await client.close()
        # the gateway stopped: its spans are flushed; the engine's leave within its 200 ms schedule
        received = receiver.received
        assert received is not None

        def joined() -> bool:
            traces = {span.trace_id for span in received if span.name == SERVER_SPAN}
            return any(span.name == SPAN_NAME and span.trace_id in traces for span in received)

        await receiver.wait_until(joined, timeout_s=30)
        return text, list(received)
    finally:
        await receiver.stop()


@pytest.mark.engine
@pytest.mark.slow
def test_a_request_through_the_gateway_is_one_trace_with_the_engines_span(embedded_engine) -> None:
    engine = embedded_engine
    assert engine.trace_sink is not None, "the session engine exports no trace spans"
    with engine.trace_sink.released() as port:
        text, spans = asyncio.run(one_traced_request(engine, port))
    assert text
    gateway_spans = [span for span in spans if span.service == SERVICE_NAME]
    [server] = [span for span in gateway_spans if span.name == SERVER_SPAN]
    trace = [span for span in spans if span.trace_id == server.trace_id]
    assert {span.trace_id for span in gateway_spans} == {server.trace_id}, "the gateway's spans are not one trace"
    named = {span.name: span for span in trace}
    assert set(named) == {SERVER_SPAN, ADMISSION_SPAN, ATTEMPT_SPAN, RELAY_SPAN, SPAN_NAME}, sorted(named)
    admission, attempt, relay, engine_span = (named[name] for name in (ADMISSION_SPAN, ATTEMPT_SPAN, RELAY_SPAN, SPAN_NAME))
    assert server.parent_span_id is None
    assert admission.parent_span_id == server.span_id and attempt.parent_span_id == server.span_id
    assert relay.parent_span_id == attempt.span_id and "first_byte" in relay.events
    # the engine's span is the attempt's child: the gateway forwarded the attempt's own context
    assert engine_span.parent_span_id == attempt.span_id
    assert engine_span.service != SERVICE_NAME
    assert attempt.attributes["vlmserve.replica"] == engine.base_url.removeprefix("http://")
    assert attempt.attributes["http.response.status_code"] == 200 and attempt.attributes["vlmserve.attempt"] == 0
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.usage.output_tokens"] == engine_span.attributes.get("gen_ai.usage.completion_tokens")
