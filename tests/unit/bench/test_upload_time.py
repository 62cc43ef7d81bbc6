"""upload_s: until the request's last byte left the client, seen on a server that reads a large body slowly."""

from __future__ import annotations

import asyncio
import time

import pytest

from vlmserve.bench.client import stream_request
from vlmserve.bench.http_stream import ConnectionPool
from vlmserve.results.records import RequestRecord

ANSWER = b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":{"completion_tokens":1}}\n\ndata: [DONE]\n\n'


async def _slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, seen: list[bytes]) -> None:
    """Reads the head at once, waits, then drains the body: the client's upload waits with it."""
    head = await reader.readuntil(b"\r\n\r\n")
    seen.append(head)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    await asyncio.sleep(delay_s)
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
    await writer.drain()
    writer.close()


async def _one(body: bytes, delay_s: float, extra: bytes = b"") -> tuple[RequestRecord, list[bytes]]:
    seen: list[bytes] = []
    server = await asyncio.start_server(lambda r, w: _slow_reader(r, w, delay_s, seen), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool(f"http://127.0.0.1:{port}/v1/chat/completions")
    record = RequestRecord("r", 0.0, 0.0)
    offset = time.time() - time.perf_counter()
    try:
        await stream_request(pool, body, record, clock_offset=offset, timeout_s=10, extra_headers=extra)
    finally:
        pool.close()
        server.close()
    return record, seen


def _loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


@pytest.mark.parametrize("loop", _loops())
def test_a_body_larger_than_the_socket_buffers_takes_as_long_as_the_server_makes_it(loop: str) -> None:
    body = b"x" * (48 * 1024 * 1024)
    runner = asyncio.run if loop == "asyncio" else __import__("uvloop").run
    record, _ = runner(_one(body, delay_s=0.4))
    assert record.ok, record.error_message
    assert record.request_bytes == len(body)
    assert record.upload_s is not None and 0.3 < record.upload_s <= record.ttft_s  # type: ignore[operator]


def test_a_small_body_is_written_at_once_and_the_traceparent_is_sent() -> None:
    record, seen = asyncio.run(
        _one(b'{"x":1}', delay_s=0.2, extra=b"traceparent: 00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01\r\n")
    )
    assert record.ok and record.request_bytes == 7
    assert record.upload_s is not None and record.upload_s < 0.1
    assert b"\r\ntraceparent: 00-" + b"a" * 32 in seen[0] and b"Content-Length: 7" in seen[0]
