"""Active health probes (replicas.py) through the gateway's own keep-alive client, against real sockets.

Each "replica" here is a raw asyncio server, so a test controls every byte: a well-behaved
engine, one that answers 500, one that sends garbage, one that sends a head and stalls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from vlmserve.gateway.replicas import ReplicaPool

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


class FakeReplica:
    """A listening socket that answers each request head with `answer`, recording heads and connections."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.connections = 0
        self.closed_by_peer = asyncio.Event()
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                await self.answer(head, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_peer.set()
        finally:
            writer.close()


@asynccontextmanager
async def fake_replica(answer: Answer) -> AsyncIterator[FakeReplica]:
    replica = FakeReplica(answer)
    replica.server = await asyncio.start_server(replica._serve, "127.0.0.1", 0)
    try:
        yield replica
    finally:
        replica.server.close()


async def engine_like(head: bytes, writer: asyncio.StreamWriter) -> None:
    body = json.dumps({"object": "list", "data": [{"id": "sim-vlm"}]}).encode() if b" /v1/models " in head else b""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


async def answers_500(head: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno")


async def answers_garbage(head: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


async def stalls_after_the_head(head: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part of it")


async def test_probes_carry_the_replica_key_and_reuse_one_connection() -> None:
    async with fake_replica(engine_like) as replica:
        pool = ReplicaPool([replica.url], health_interval_s=60.0, upstream_headers={"Authorization": "Bearer sk-replica"})
        await pool.start()  # checks health at once, then fetches the model list
        try:
            state = pool.replicas[0]
            assert state.healthy and state.model_ids == {"sim-vlm"}
            for _ in range(3):
                await pool._check_health(state)
            assert state.healthy
        finally:
            await pool.stop()
    paths = [head.split(b" ")[1] for head in replica.heads]
    assert paths == [b"/health", b"/v1/models", b"/health", b"/health", b"/health"]
    assert all(b"\r\nAuthorization: Bearer sk-replica\r\n" in head for head in replica.heads)
    assert replica.connections == 1  # kept alive between probes


async def test_probe_failures_are_told_apart_and_a_stalled_probe_closes_its_connection() -> None:
    async with (
        fake_replica(answers_500) as failing,
        fake_replica(answers_garbage) as garbled,
        fake_replica(stalls_after_the_head) as stalling,
    ):
        closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        refused_url = f"http://127.0.0.1:{closed.sockets[0].getsockname()[1]}"
        closed.close()
        await closed.wait_closed()
        pool = ReplicaPool([failing.url, garbled.url, stalling.url, refused_url], health_interval_s=60.0)
        pool.probe_timeout_s = 0.5
        await pool.start()
        try:
            verdicts = [await pool._probe_status(replica, "/health") for replica in pool.replicas]
            assert not any(replica.healthy for replica in pool.replicas)
        finally:
            await pool.stop()
        assert verdicts == [(None, "error"), (None, "error"), (None, "timeout"), (None, "refused")]
        # the half-read answer's connection is not kept for the next probe: the replica sees it closed
        await asyncio.wait_for(stalling.closed_by_peer.wait(), 5)


@pytest.mark.parametrize("health_interval_s, expected", [(0.2, 3.0), (1.0, 3.0), (5.0, 15.0)])
def test_a_probe_may_take_three_health_intervals_and_at_least_three_seconds(health_interval_s: float, expected: float) -> None:
    assert ReplicaPool(["http://127.0.0.1:9"], health_interval_s=health_interval_s).probe_timeout_s == expected
