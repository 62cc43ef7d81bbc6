"""--engine-traces against an engine that exports no spans (the sim): the run completes, says what is missing."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL
from vlmserve.bench.runner import Target, run_load
from vlmserve.spec import LoadSpec


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_traced_run_without_spans_keeps_client_figures_and_warns(sim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vlmserve.bench.runner.SPAN_WAIT_S", 0.3)
    port = _free_port()
    load = LoadSpec(dataset="images", concurrency=2, num_requests=8, input_len=16, output_len=4, workers=2)
    result = asyncio.run(run_load(load, Target(sim.base_url, SIM_MODEL), progress=False, engine_traces=f"127.0.0.1:{port}"))
    records = result.records
    assert all(record.ok for record in records)
    # a fresh trace id per request, made in each worker process
    assert len({record.trace_id for record in records}) == 8 and {record.worker for record in records} == {0, 1}
    assert all(record.request_bytes and record.request_bytes > 1000 for record in records)
    assert all(record.upload_s is not None and 0 <= record.upload_s < record.ttft_s for record in records)  # type: ignore[operator]
    assert all(record.request_type == "image" for record in records)
    assert result.meta.engine_traces.spans_received == 0
    [warning] = [text for text in result.warnings if "engine span" in text]
    assert warning.startswith(f"8 of 8 answered requests got no engine span at http://127.0.0.1:{port}/v1/traces")
    image = (result.summary.by_type or {})["image"]
    assert image.breakdown is not None and image.breakdown.source == "client only"
    # the port is free again: the receiver stopped with the run
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))
