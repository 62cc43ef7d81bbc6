"""Where a request's time goes, on the real embedded vLLM engine exporting its trace spans to the bench.

The shared session engine starts with `--otlp-traces-endpoint` pointing at a sink that drops spans
(the launcher sets the OTLP/HTTP protocol and a 200 ms span flush); this test frees that port and the
bench's own receiver listens there instead, so no second engine is started for it.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.helpers.gateway_fixtures import running_gateway
from vlmserve.bench.runner import Target, run_load
from vlmserve.spec import SLO, LoadSpec


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.exclusive  # its bound on the time outside the engine failed once beside a busy test worker
def test_text_and_image_ttft_breakdown_adds_up_on_the_real_engine(embedded_engine) -> None:
    engine = embedded_engine
    assert engine.trace_sink is not None, "the session engine exports no trace spans"
    # 256-token prompts, so prefill is a visible part of the TTFT
    with engine.trace_sink.released() as port:
        load = LoadSpec(
            dataset="mixed",
            mix={"random": 0.5, "images": 0.5},
            concurrency=2,
            num_requests=24,
            warmup=2,
            input_len=256,
            output_len=8,
            image_size=(64, 64),
            tokenizer=engine.model_path,
        )
        result = asyncio.run(
            run_load(
                load,
                Target(engine.base_url, engine.model),
                progress=False,
                engine_traces=f"127.0.0.1:{port}",
                slo=SLO.parse("image:ttft_p95=30s,text:ttft_p95=30s"),
            )
        )

        async def through_gateway():  # the gateway forwards the trace context, so spans still match
            async with running_gateway([engine.base_url]) as gateway:
                return await run_load(
                    load.model_copy(update={"num_requests": 6, "warmup": 0}),
                    Target(gateway.base_url, engine.model),
                    progress=False,
                    engine_traces=f"127.0.0.1:{port}",
                )

        gateway_result = asyncio.run(through_gateway())
    assert gateway_result.summary.meta.engine_traces.measured_with_span == 6, gateway_result.summary.meta
    summary = result.summary
    print(
        json.dumps(
            {name: block.breakdown.model_dump() if block.breakdown else None for name, block in (summary.by_type or {}).items()},
            indent=1,
        )
    )
    print(
        json.dumps(
            {
                "server": summary.server.model_dump(mode="json") if summary.server else None,
                "engine_traces": summary.meta.model_dump(mode="json")["engine_traces"],
                "warnings": summary.warnings,
            },
            indent=1,
        )
    )
    assert summary.requests.completed == 24, summary.requests
    assert not summary.warnings, summary.warnings
    assert summary.meta.engine_traces.measured_with_span == 24
    by_type = summary.by_type or {}
    assert set(by_type) == {"text", "image"}
    for request_type in ("text", "image"):
        block = by_type[request_type]
        breakdown = block.breakdown
        assert breakdown is not None and breakdown.source == "engine spans", request_type
        assert breakdown.requests == block.completed > 0
        assert breakdown.queue_ms is not None and breakdown.prefill_ms is not None and breakdown.prefill_ms > 0
        assert breakdown.upload_ms is not None and breakdown.upload_ms >= 0
        parts = breakdown.upload_ms + (breakdown.frontend_ms or 0.0) + breakdown.queue_ms + breakdown.prefill_ms
        assert parts == pytest.approx(breakdown.client_ttft_ms)
        # the engine's clock and the upload explain the client's TTFT but for the time on neither clock:
        # loopback HTTP and the API server's work before vLLM stamps the request's arrival. That hole
        # grows with the machine's load faster than the engine's own parts (measured 0.04-0.08 of the
        # engine's TTFT on a quiet machine, up to 0.17 under two busy loops; a fixed 12 ms bound failed
        # on a CI runner). A wrong span attribute or a part lost from the engine's TTFT moves it by a
        # factor, so the bound is half the engine's TTFT measured in the same run.
        assert breakdown.accounted is not None and breakdown.accounted <= 1.02, (request_type, breakdown)
        assert breakdown.http_ms is not None and breakdown.engine_ttft_ms is not None
        assert breakdown.http_ms < 0.5 * breakdown.engine_ttft_ms, (request_type, breakdown)
        assert block.goodput is not None and block.goodput.all_met
    assert by_type["image"].request_bytes_mean > by_type["text"].request_bytes_mean  # type: ignore[operator]
    assert summary.figure("by_type.image.breakdown.prefill_ms") == by_type["image"].breakdown.prefill_ms  # type: ignore[union-attr]
    server = summary.server
    assert server is not None and server.engine_breakdown is not None and (server.engine_breakdown.ttft_ms or 0) > 0
    assert server.engine_breakdown.frontend_ms is not None and server.mm_cache_hit_rate is not None
