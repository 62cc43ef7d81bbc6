"""`vlmserve gateway --otlp-traces-endpoint` as a user runs it: bad values are one line and exit 2; a traced
gateway with two workers in front of a sim engine exports every request's spans, the last ones on drain."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, sim_engines
from tests.helpers.gateway_proc import start_gateway
from tests.helpers.procs import free_port
from vlmserve.bench.engine_traces import TraceReceiver
from vlmserve.cli.app import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--otlp-traces-endpoint", "grpc://collector:4317"],
            "error: --otlp-traces-endpoint 'grpc://collector:4317' is not an OTLP/HTTP URL",
        ),
        (
            ["--otlp-traces-endpoint", "http://collector:70000/v1/traces"],
            "error: --otlp-traces-endpoint 'http://collector:70000/v1/traces': Port out of range",
        ),
        (
            ["--trace-sample-ratio", "1.5"],
            "error: --trace-sample-ratio must be between 0 and 1 (the share of new traces kept), got 1.5",
        ),
        (["--trace-sample-ratio", "nan"], "error: --trace-sample-ratio must be between 0 and 1"),
    ],
)
def test_bad_tracing_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--replica", "http://127.0.0.1:1", *args])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    assert stderr.startswith(message) and len(stderr.strip().splitlines()) == 1, stderr


async def test_a_traced_gateway_with_workers_exports_every_request_and_flushes_on_drain(tmp_path: Path) -> None:
    receiver = TraceReceiver("127.0.0.1", free_port(), keep_all=True)
    await receiver.start()
    try:
        with (
            sim_engines(1, tmp_path, ttft_ms=5, itl_ms=1) as engines,
            start_gateway(
                [engines[0].base_url], tmp_path, "--workers", "2", "--otlp-traces-endpoint", f"http://127.0.0.1:{receiver.port}"
            ) as gateway,
        ):  # no path: /v1/traces is added
            results = []
            for _ in range(6):  # a connection each: the kernel spreads them over the workers
                async with aiohttp.ClientSession() as session:
                    results.append(await post_chat(session, gateway.base_url, chat_body("hi")))
            # SIGTERM: each worker drains and flushes its last spans (the batch delay is 5 s: not yet sent)
            gateway.process.terminate()
            assert await asyncio.to_thread(gateway.process.wait, 30) == 0
        assert [result.status for result in results] == [200] * 6
        ids = {result.headers["X-Request-ID"] for result in results}
        received = receiver.received or []
        servers = [span for span in received if span.name == "POST /v1/chat/completions"]
        assert {span.attributes["vlmserve.request_id"] for span in servers} == ids
        assert len({span.trace_id for span in servers}) == 6
        assert len(received) == 6 * 4  # server, admission, attempt, relay per request
    finally:
        await receiver.stop()
