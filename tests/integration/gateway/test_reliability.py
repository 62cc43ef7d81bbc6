"""Failures the gateway must absorb: dead replicas, stalls, slow first tokens, clients leaving, shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway, scrape_engine, varied_sim_engines, wait_until
from tests.helpers.sim import SimHandle
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.server import start_gateway


@pytest.fixture(scope="module")
def troubled_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimHandle]]:
    """victim: to be killed (4 slots, so some requests queue with no byte sent yet);
    staller: one slot, streams stop forever after 3 tokens; failing: answers every request 500."""
    roles = {
        "victim": {"ttft_ms": 20, "itl_ms": 20, "max_num_seqs": 4},
        "staller": {"ttft_ms": 20, "itl_ms": 10, "max_num_seqs": 1, "stall_after_tokens": 3},
        "failing": {"ttft_ms": 20, "itl_ms": 5, "error_rate": 1.0},
    }
    with varied_sim_engines(tmp_path_factory.mktemp("troubled"), list(roles.values())) as handles:
        yield dict(zip(roles, handles))


async def test_replica_killed_mid_run_loses_no_unstarted_request(
    constant_engines: list[SimHandle], troubled_engines: dict[str, SimHandle], tmp_path: Path
) -> None:
    victim = troubled_engines["victim"]
    audit = tmp_path / "audit.jsonl"
    async with (
        running_gateway([*constant_engines[:2], victim], policy="round-robin", audit_log=audit) as gw,
        aiohttp.ClientSession() as session,
    ):
        requests = [asyncio.create_task(post_chat(session, gw.base_url, chat_body(f"q{i}", max_tokens=30))) for i in range(45)]

        async def victim_streaming_with_a_queue() -> bool:
            figures = await scrape_engine(session, victim)
            return figures.get("vllm:generation_tokens_total", 0) >= 4 and figures.get("vllm:num_requests_waiting", 0) >= 1

        # Kill it once its 4 running streams are mid-answer and more requests wait in its queue.
        assert await wait_until(victim_streaming_with_a_queue, timeout_s=20, interval_s=0.01)
        victim.kill()
        results = await asyncio.gather(*requests)
        after = [await post_chat(session, gw.base_url, chat_body(f"after {i}", max_tokens=4)) for i in range(6)]
        retries = await (await session.get(gw.base_url + "/metrics")).text()
    complete = [r for r in results if r.done and r.error is None and r.completion_tokens == 30]
    cut = [r for r in results if r.error is not None]
    assert all(r.status == 200 for r in results)
    assert len(complete) + len(cut) == len(results)  # nobody hangs or gets a silent truncation
    assert 1 <= len(cut) <= 4  # only streams already running on the victim could be cut...
    assert all(r.content_chunks > 0 and not r.done and r.error["code"] == "upstream_stream_error" for r in cut)
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    retried = [r for r in records if r["retries"] > 0]
    assert len(retried) >= 5 and all(r["status"] == "200" for r in retried)  # ...the queued ones were retried
    assert all(r.status == 200 and r.done for r in after)  # and the dead replica is routed around
    assert 'vlmserve_gateway_retries_total{reason="connect_error"' in retries


async def test_failing_replica_is_ejected_and_requests_succeed_elsewhere(
    constant_engines: list[SimHandle], troubled_engines: dict[str, SimHandle]
) -> None:
    failing = troubled_engines["failing"]
    async with (
        running_gateway([constant_engines[0], failing], policy="round-robin", breaker_failures=3, breaker_open_s=30) as gw,
        aiohttp.ClientSession() as session,
    ):
        results = [await post_chat(session, gw.base_url, chat_body(f"q{i}", max_tokens=3)) for i in range(10)]
        assert all(r.status == 200 and r.done for r in results)
        failing_replica = gw.gateway.pool.replicas[1]
        assert failing_replica.breaker.state.value == "open"
        assert failing_replica.dispatched_total == 3  # ejected after 3 failures, no traffic since
        text = await (await session.get(gw.base_url + "/metrics")).text()
    assert f'vlmserve_gateway_ejections_total{{replica="{failing_replica.name}"}} 1.0' in text
    assert f'vlmserve_gateway_replica_healthy{{replica="{failing_replica.name}"}} 0.0' in text


async def test_stalled_stream_ends_with_error_event_and_slow_first_token_times_out(
    troubled_engines: dict[str, SimHandle],
) -> None:
    staller = troubled_engines["staller"]
    async with (
        running_gateway([staller], idle_chunk_timeout_s=0.5, first_token_timeout_s=0.5, max_attempts=1) as gw,
        aiohttp.ClientSession() as session,
    ):
        stalled = await asyncio.wait_for(post_chat(session, gw.base_url, chat_body("tell me", max_tokens=50)), 10)
        assert stalled.status == 200 and stalled.content_chunks >= 1 and not stalled.done
        assert stalled.error["code"] == "idle_chunk_timeout"
        # The gateway hung up on the stalled request, so the engine's only slot is free again;
        # now occupy it directly, so the next request waits in the engine's queue with no byte sent.
        assert await wait_until(lambda: _running_is(session, staller, 0.0))
        occupant = asyncio.create_task(post_chat(session, staller.base_url, chat_body("hog", max_tokens=5000)))
        assert await wait_until(lambda: _running_is(session, staller, 1.0))
        queued = await asyncio.wait_for(post_chat(session, gw.base_url, chat_body("me next?")), 10)
        assert queued.status == 504 and queued.body["error"]["code"] == "first_token_timeout"
        occupant.cancel()
        await asyncio.gather(occupant, return_exceptions=True)


async def _running_is(session: aiohttp.ClientSession, engine: SimHandle, value: float) -> bool:
    return (await scrape_engine(session, engine)).get("vllm:num_requests_running") == value


async def test_client_disconnect_cancels_the_upstream_request(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    engine = constant_engines[2]
    audit = tmp_path / "audit.jsonl"
    async with running_gateway([engine], audit_log=audit) as gw, aiohttp.ClientSession() as session:
        async with session.post(gw.base_url + "/v1/chat/completions", json=chat_body("long story", max_tokens=2000)) as response:
            assert response.status == 200
            await response.content.readline()
            assert await _running_is(session, engine, 1.0)
            response.close()  # the client walks away mid-answer
        assert await wait_until(lambda: _running_is(session, engine, 0.0), timeout_s=5)
        assert await wait_until(lambda: _async_true(gw.gateway.pool.replicas[0].in_flight == 0))
    record = json.loads(audit.read_text().splitlines()[0])
    assert record["status"] == "abandoned"


async def _async_true(value: bool) -> bool:
    return value


async def test_shutdown_drains_streams_in_progress(constant_engines: list[SimHandle]) -> None:
    running = await start_gateway(GatewayConfig(replicas=[constant_engines[0].base_url], port=0, drain_timeout_s=10))
    async with aiohttp.ClientSession() as session:
        under_way = asyncio.Event()
        stream = asyncio.create_task(
            post_chat(session, running.base_url, chat_body("finish me", max_tokens=100), first_token=under_way)
        )
        await asyncio.wait_for(under_way.wait(), 30)  # 100 tokens at 5 ms: most of it is still to come
        await running.stop()
        result = await stream
        assert result.status == 200 and result.done and result.completion_tokens == 100
        with pytest.raises(aiohttp.ClientConnectionError):
            await post_chat(session, running.base_url, chat_body("too late"))
