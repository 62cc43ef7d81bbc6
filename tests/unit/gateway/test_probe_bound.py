"""The gateway's probes of its replicas (replicas.py `_probe_status`: /health, /v1/models, /metrics and
the merged /admin/engine-metrics) read at most prometheus_text.MAX_PAGE_BYTES of an answer
(http1.client.CappedBody): past it
the connection is closed at once and the probe fails, whatever the replica keeps sending."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from vlmserve.gateway.replicas import ReplicaPool
from vlmserve.http1.client import ClientPool
from vlmserve.prometheus_text import MAX_PAGE_BYTES

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]
PIECE = b"x" * (1 << 20)


@asynccontextmanager
async def replica(answer: Answer) -> AsyncIterator[ReplicaPool]:
    """A real server answering every GET with `answer`, and a replica pool probing it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    pool = ReplicaPool([f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"], health_interval_s=1.0)
    pool._client = ClientPool(connect_timeout_s=2)
    try:
        yield pool
    finally:
        pool._client.close()
        server.close()


def endless(head: bytes, chunked: bool = False) -> Answer:
    """An answer of 10 GB, were it all read."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        for _ in range(10_000):
            writer.write(b"%x\r\n%s\r\n" % (len(PIECE), PIECE) if chunked else PIECE)
            await writer.drain()

    return answer


async def test_a_page_within_the_bound_is_read_whole_and_the_connection_kept() -> None:
    page = b"vllm:x 1\n" * 100_000

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()

    async with replica(answer) as pool:
        assert await pool._probe_status(pool.replicas[0], "/metrics") == (page, "ok")
        assert await pool._probe_status(pool.replicas[0], "/metrics") == (page, "ok")
        assert sum(len(idle) for idle in pool._client._idle.values()) == 1  # one connection, reused


@pytest.mark.hostile(
    "a replica answering a gateway probe with an endless body (declared 10 GB, chunked, or "
    "delimited by the close): refused past 8 MiB at once, the connection closed, memory bounded"
)
@pytest.mark.parametrize(
    "answer",
    [
        endless(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n"),
        endless(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunked=True),
        endless(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"),
    ],
    ids=["length", "chunked", "close"],
)
async def test_an_endless_answer_is_cut_past_the_bound(answer: Answer) -> None:
    async with replica(answer) as pool:
        started = time.monotonic()
        body, why = await asyncio.wait_for(pool._probe_status(pool.replicas[0], "/metrics"), 10)
        took = time.monotonic() - started
        assert not any(pool._client._idle.values())  # that connection is never reused
    assert body is None and why == f"over {MAX_PAGE_BYTES:,} bytes"
    assert took < pool.probe_timeout_s  # cut at the bound, not left to time out
