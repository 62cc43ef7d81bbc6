"""`--trace-file`: the sim engine's per-request emission times, the ground truth benchmarks/client_accuracy.py judges clients by."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.helpers.sim import start_sim_engine


def test_trace_has_one_line_per_request_with_constant_mode_timing(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    with start_sim_engine(model="m", ttft_ms=30, itl_ms=8, trace_file=str(trace)) as engine:
        body = {"model": "m", "prompt": "hello", "max_tokens": 5, "ignore_eos": True, "stream": True}
        httpx.post(f"{engine.base_url}/v1/completions", json=body, headers={"X-Request-ID": "client-7"}, timeout=30)
        httpx.post(f"{engine.base_url}/v1/completions", json={**body, "stream": False}, timeout=30)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(trace.read_text().splitlines() if trace.exists() else []) < 2:
            time.sleep(0.05)  # the engine flushes when idle
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == 2
    streamed, plain = lines
    assert streamed["client_request_id"] == "client-7" and plain["client_request_id"] is None
    for line in lines:
        assert line["outcome"] == "finished"
        assert sum(line["chunk_tokens"]) == 5 and line["first_token_s"] == line["chunk_s"][0]
        # constant mode puts the chunk ending with token k at arrival + 30 ms + (k - 1) x 8 ms: never
        # earlier (1 ms for the clock's rounding), and later only by what a shared machine delays the
        # loop. A check on the first-to-last span failed: a late first chunk shortens it.
        tokens_so_far = 0
        for chunk_s, tokens in zip(line["chunk_s"], line["chunk_tokens"], strict=True):
            tokens_so_far += tokens
            due_ms = 30 + (tokens_so_far - 1) * 8
            offset_ms = 1000 * (chunk_s - line["arrival_s"])
            assert due_ms - 1 <= offset_ms < due_ms + 250, (line, due_ms, offset_ms)


def test_no_trace_file_by_default(tmp_path: Path) -> None:
    with start_sim_engine(model="m", ttft_ms=1, itl_ms=1) as engine:
        httpx.post(f"{engine.base_url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}, timeout=30)
    assert not list(tmp_path.iterdir())
