"""Replica servers in this process for the gateway's /admin/engine-metrics tests: /health answers 200,
/metrics as the test says (a page, an endless body, an error), anything else 404."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

Metrics = Callable[[asyncio.StreamWriter], Awaitable[None]]


def page(queries: int) -> Metrics:
    """A vLLM-like page with this many prefix-cache queries."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        text = (
            f"# TYPE vllm:prefix_cache_queries_total counter\n"
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}\n'
        ).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))

    return answer


async def endless(writer: asyncio.StreamWriter) -> None:
    """10 GB, were it all read."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
    for _ in range(10_000):
        writer.write(b"#" * (1 << 20))
        await writer.drain()


async def failing(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")


@asynccontextmanager
async def replica(metrics: Metrics) -> AsyncIterator[str]:
    """A replica server: /health answers 200, /metrics as `metrics` says, anything else 404."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path == b"/metrics":
                    await metrics(writer)
                else:
                    writer.write(
                        b"HTTP/1.1 %s\r\nContent-Length: 2\r\n\r\n{}" % (b"200 OK" if path == b"/health" else b"404 Not Found")
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:  # the test's loop ends with a connection still open: not a failure
            return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@asynccontextmanager
async def replicas(*answers: Metrics) -> AsyncIterator[list[str]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(replica(answer)) for answer in answers]
