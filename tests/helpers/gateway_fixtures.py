"""Fixtures for gateway tests: sim engines in subprocesses (started in parallel) and a small client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.sim import SimHandle, free_port, sim_engine_argv, wait_ready
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.server import RunningGateway, start_gateway

MODEL = "sim-model"


@contextmanager
def sim_engines(count: int, log_dir: Path, **options: Any) -> Iterator[list[SimHandle]]:
    """Start `count` alike sim engines at once and stop them after."""
    with varied_sim_engines(log_dir, [options] * count) as handles:
        yield handles


@contextmanager
def varied_sim_engines(log_dir: Path, option_sets: list[dict[str, Any]]) -> Iterator[list[SimHandle]]:
    """One sim engine per option set, all started before waiting (each start costs seconds of imports)."""
    import subprocess

    handles: list[SimHandle] = []
    try:
        for options in option_sets:
            port = free_port()
            log_path = log_dir / f"sim-{port}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(sim_engine_argv(port, model=MODEL, **options), stdout=log, stderr=subprocess.STDOUT)
            handles.append(SimHandle(process, port, log_path))
        for handle in handles:
            wait_ready(handle, timeout_s=60)
        yield handles
    finally:
        for handle in handles:
            handle.stop()


@pytest.fixture(scope="session")
def constant_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimHandle]]:
    """Three engines with fixed timing (TTFT 20 ms, 5 ms per token): behaviour, not speed."""
    with sim_engines(3, tmp_path_factory.mktemp("sims"), ttft_ms=20, itl_ms=5) as handles:
        yield handles


@dataclass
class StreamResult:
    """What a streaming client saw."""

    status: int
    events: list[dict] = field(default_factory=list)
    done: bool = False
    error: dict | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    ttft_s: float | None = None
    e2e_s: float = 0.0

    @property
    def content_chunks(self) -> int:
        return sum(1 for e in self.events if e.get("choices") and (e["choices"][0].get("delta") or {}).get("content"))

    @property
    def completion_tokens(self) -> int | None:
        for event in reversed(self.events):
            if event.get("usage"):
                return event["usage"].get("completion_tokens")
        return None


def chat_body(content: str, max_tokens: int = 8, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    }
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body.update(extra)
    return body


async def post_chat(
    session: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
    first_token: asyncio.Event | None = None,
) -> StreamResult:
    """POST and read the whole answer, SSE or JSON, recording TTFT (first content chunk) and E2E.
    `first_token` is set when the first content chunk arrives: a test that must act while the
    stream is under way waits on it rather than on a guess of how long the start takes."""
    started = time.perf_counter()
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(
        base_url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    ) as response:
        result = StreamResult(status=response.status, headers=dict(response.headers))
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            buffer = b""
            async for piece in response.content.iter_any():
                buffer += piece
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:]
                    if payload == b"[DONE]":
                        result.done = True
                        continue
                    event = json.loads(payload)
                    if "error" in event:
                        result.error = event["error"]
                    result.events.append(event)
                    delta = (event.get("choices") or [{}])[0].get("delta") or {}
                    if result.ttft_s is None and delta.get("content"):
                        result.ttft_s = time.perf_counter() - started
                        if first_token is not None:
                            first_token.set()
        else:
            raw = await response.read()
            try:
                result.body = json.loads(raw)
            except ValueError:
                result.body = raw
    result.e2e_s = time.perf_counter() - started
    return result


async def scrape_engine(session: aiohttp.ClientSession, handle: SimHandle) -> dict[str, float]:
    """Sum every sample of each vllm: metric (over labels) from an engine's /metrics."""
    async with session.get(handle.base_url + "/metrics") as response:
        text = await response.text()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


async def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval_s)
    return False


@asynccontextmanager
async def running_gateway(replicas: list[SimHandle] | list[str], **settings: Any) -> AsyncIterator[RunningGateway]:
    """A gateway in this test's event loop on a free port, stopped (drained) afterwards."""
    urls = [r if isinstance(r, str) else r.base_url for r in replicas]
    running = await start_gateway(GatewayConfig(replicas=urls, port=0, **settings))
    try:
        yield running
    finally:
        await running.stop()
