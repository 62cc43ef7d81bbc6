"""Failures are charged to whoever caused them, and passive ejection can shrink the pool, never empty it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway, varied_sim_engines, wait_until
from tests.helpers.sim import SimHandle

POISON = "XPOISONX"


@pytest.fixture(scope="module")
def poisonable_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimHandle]]:
    """Three alike engines that answer 500 to any request carrying POISON (the last one gets killed)."""
    options = {"ttft_ms": 10, "itl_ms": 2, "poison_marker": POISON}
    with varied_sim_engines(tmp_path_factory.mktemp("poison"), [options] * 3) as handles:
        yield handles


@asynccontextmanager
async def resetting_replica() -> AsyncIterator[tuple[str, list[int]]]:
    """A replica that passes its health checks but resets every API request (a broken engine).

    Yields its URL and a one-item list counting the API requests it received."""
    hits = [0]
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        body = b"{}" if head.startswith(b"GET /health") else models if head.startswith(b"GET /v1/models") else None
        if body is None:
            hits[0] += 1
            writer.transport.abort()  # connection reset before any answer
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", hits
    finally:
        server.close()


def _keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text("tenants:\n  - name: attacker\n    keys: [attacker-key]\n  - name: victim\n    keys: [victim-key]\n")
    return path


@pytest.mark.hostile("a tenant's poison requests (5xx on every replica) try to eject every replica")
async def test_poison_requests_cannot_eject_replicas_or_starve_another_tenant(
    poisonable_engines: list[SimHandle], tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    async with (
        running_gateway(
            poisonable_engines[:2], keys_file=_keys_file(tmp_path), audit_log=audit, breaker_failures=3, breaker_open_s=30
        ) as gw,
        aiohttp.ClientSession() as session,
    ):
        health_codes: list[int] = []
        stop = asyncio.Event()

        async def watch_health() -> None:
            while not stop.is_set():
                async with session.get(gw.base_url + "/health") as response:
                    health_codes.append(response.status)
                await asyncio.sleep(0.02)

        async def attack() -> list[int]:
            codes = []
            for burst in range(10):
                results = await asyncio.gather(
                    *(
                        post_chat(
                            session,
                            gw.base_url,
                            chat_body(f"{POISON} {burst}.{i}", max_tokens=4),
                            headers={"Authorization": "Bearer attacker-key"},
                        )
                        for i in range(6)
                    )
                )
                codes += [r.status for r in results]
            return codes

        async def use() -> list[bool]:
            results = await asyncio.gather(
                *(
                    post_chat(
                        session,
                        gw.base_url,
                        chat_body(f"question {i}", max_tokens=4),
                        headers={"Authorization": "Bearer victim-key"},
                    )
                    for i in range(60)
                )
            )
            return [r.status == 200 and r.done and r.error is None for r in results]

        watcher = asyncio.create_task(watch_health())
        attacker_codes, victim_ok = await asyncio.gather(attack(), use())
        after = [
            await post_chat(
                session, gw.base_url, chat_body(f"after {i}", max_tokens=4), headers={"Authorization": "Bearer victim-key"}
            )
            for i in range(4)
        ]
        stop.set()
        await watcher
        breakers = [r.breaker.state.value for r in gw.gateway.pool.replicas]
    assert health_codes and set(health_codes) == {200}
    assert sum(victim_ok) >= 0.95 * len(victim_ok)
    assert all(r.status == 200 for r in after)
    assert attacker_codes == [500] * 60  # the engines' own answer comes back
    assert breakers == ["closed", "closed"]
    poisoned = [json.loads(line) for line in audit.read_text().splitlines() if '"attacker"' in line]
    assert len(poisoned) == 60 and all(len(r["attempts"]) <= 2 for r in poisoned)  # not retried past a second 5xx


@pytest.mark.hostile("replicas that break every request would be ejected all at once")
async def test_passive_ejection_never_removes_more_than_the_fraction(poisonable_engines: list[SimHandle]) -> None:
    async with (
        resetting_replica() as (broken_a, hits_a),
        resetting_replica() as (broken_b, hits_b),
        running_gateway(
            [poisonable_engines[0].base_url, broken_a, broken_b],
            policy="round-robin",
            max_ejection_fraction=0.5,
            breaker_failures=1,
            breaker_open_s=60,
        ) as gw,
        aiohttp.ClientSession() as session,
    ):
        most_ejected = 0
        results = []
        for i in range(24):
            results.append(await post_chat(session, gw.base_url, chat_body(f"q{i}", max_tokens=2, stream=i % 2 == 0)))
            most_ejected = max(most_ejected, gw.gateway.pool.ejected_count())
        metrics = await (await session.get(gw.base_url + "/metrics")).text()
    assert all(r.status == 200 for r in results)  # every failure was retried on the good replica
    assert most_ejected == 1  # floor(0.5 x 3): one broken replica ejected, the other kept in rotation...
    assert min(hits_a[0], hits_b[0]) >= 1 and hits_a[0] + hits_b[0] >= 6  # ...and still failing requests
    assert "vlmserve_gateway_ejected_replicas 1.0" in metrics


@pytest.mark.hostile("with the only good replica killed and the others ejected, nothing would be routed to")
async def test_panic_mode_routes_to_replicas_passing_health_checks(poisonable_engines: list[SimHandle]) -> None:
    victim = poisonable_engines[2]
    async with (
        resetting_replica() as (broken, hits),
        running_gateway(
            [victim.base_url, broken],
            policy="round-robin",
            max_ejection_fraction=0.5,
            breaker_failures=1,
            breaker_open_s=60,
            health_interval_s=0.2,
        ) as gw,
        aiohttp.ClientSession() as session,
    ):
        pool = gw.gateway.pool
        for i in range(4):
            assert (await post_chat(session, gw.base_url, chat_body(f"q{i}", max_tokens=2))).status == 200
        assert [r.breaker.state.value for r in pool.replicas] == ["closed", "open"]
        victim.kill()

        async def victim_down() -> bool:
            return not pool.replicas[0].healthy

        assert await wait_until(victim_down, timeout_s=15)
        async with session.get(gw.base_url + "/health") as response:
            health = (response.status, (await response.json())["status"])
        before = hits[0]
        answer = await post_chat(session, gw.base_url, chat_body("in panic", max_tokens=2))
        metrics = await (await session.get(gw.base_url + "/metrics")).text()
    assert health == (200, "panic")
    assert hits[0] > before and answer.status == 502  # routed to the ejected replica that passes health checks
    assert "vlmserve_gateway_panic 1.0" in metrics
