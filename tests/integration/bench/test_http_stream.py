"""The bench's HTTP/1.1 stream client against real sockets: framing, reuse, and every way an answer can break."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL, bench_args
from tests.helpers.sim import start_sim_engine
from vlmserve.bench.http_stream import ConnectionLost, ConnectionPool, HttpProtocolError, post_stream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


async def _serve(handler: Handler, scenario: Callable[[ConnectionPool], Awaitable[None]]) -> int:
    """Run `scenario` against a raw asyncio server; returns how many connections it accepted."""
    accepted = 0

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool(f"http://127.0.0.1:{port}/v1/completions", {"Authorization": "Bearer k"})
    try:
        await scenario(pool)
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
    return accepted


def _collect() -> tuple[list[bytes], Callable[[bytes, float], None]]:
    pieces: list[bytes] = []
    return pieces, lambda data, _now: pieces.append(data)


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


SSE = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_chunked_answer_split_into_single_bytes_is_reassembled_and_the_connection_reused():
    async def handler(reader, writer):
        for _ in range(2):  # two requests on one keep-alive connection
            assert await _read_request(reader) == b'{"x":1}'
            for byte in CHUNKED_HEAD + _chunked(*SSE):
                writer.write(bytes([byte]))
                await writer.drain()

    async def scenario(pool):
        for _ in range(2):
            pieces, sink = _collect()
            response = await post_stream(pool, b'{"x":1}', sink)
            assert response.status == 200 and b"".join(pieces) == b"".join(SSE)

    assert asyncio.run(_serve(handler, scenario)) == 1


def test_the_chunks_of_one_read_reach_the_sink_in_one_call_with_one_time():
    """llhttp reports each chunk on its own; the bench's timing is per read, so one read is one sink call."""

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + _chunked(*SSE))  # one write: one read on loopback
        await writer.drain()

    async def scenario(pool):
        calls: list[tuple[bytes, float]] = []
        await post_stream(pool, b"{}", lambda data, now: calls.append((data, now)))
        assert [data for data, _now in calls] == [b"".join(SSE)]

    asyncio.run(_serve(handler, scenario))


def test_content_length_and_read_until_close_bodies():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b'HTTP/1.1 404 Not Found\r\nContent-Length: 22\r\n\r\n{"error":"no model m"}')
        await writer.drain()
        await _read_request(reader)  # the same connection is reused after a complete error body
        writer.write(b"HTTP/1.0 200 OK\r\n\r\ndata: [DONE]\n\n")
        await writer.drain()

    async def scenario(pool):
        _, sink = _collect()
        error = await post_stream(pool, b"{}", sink)
        assert error.status == 404 and bytes(error.error_body) == b'{"error":"no model m"}'
        pieces, sink = _collect()
        closing = await post_stream(pool, b"{}", sink)
        assert closing.status == 200 and b"".join(pieces) == b"data: [DONE]\n\n"

    assert asyncio.run(_serve(handler, scenario)) == 1


def test_an_idle_connection_the_server_closed_is_replaced_transparently():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + _chunked(*SSE))
        await writer.drain()
        # keep-alive promised, but the server closes the idle connection (as uvicorn does after 5 s)

    async def scenario(pool):
        for _ in range(2):
            pieces, sink = _collect()
            await post_stream(pool, b"{}", sink)
            assert b"".join(pieces) == b"".join(SSE)
            await asyncio.sleep(0.05)

    assert asyncio.run(_serve(handler, scenario)) == 2


def test_cut_mid_answer_and_garbage_are_errors_not_hangs():
    async def cut(reader, writer):
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + b"%x\r\n%s\r\n" % (len(SSE[0]), SSE[0]))
        await writer.drain()
        writer.transport.abort()

    async def garbage(reader, writer):
        await _read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()

    async def expect(error: type[Exception], pool) -> Exception:
        pieces, sink = _collect()
        with pytest.raises(error) as raised:
            await asyncio.wait_for(post_stream(pool, b"{}", sink), 5)
        return raised.value

    async def scenario_cut(pool):
        lost = await expect(ConnectionLost, pool)
        assert str(lost).startswith("the server closed the connection")

    async def scenario_garbage(pool):
        assert "not valid HTTP/1.1 (Expected HTTP/" in str(await expect(HttpProtocolError, pool))

    asyncio.run(_serve(cut, scenario_cut))
    asyncio.run(_serve(garbage, scenario_garbage))


def test_dropped_and_stalled_streams_are_counted_by_cause(cli, tmp_path):
    """Through the whole bench: a reset mid-stream is `disconnected`, a stall past --timeout is `timeout`."""
    import json

    with start_sim_engine(model=SIM_MODEL, ttft_ms=5, itl_ms=2, drop_after_tokens=3) as dropping:
        out = tmp_path / "drop.json"
        done = cli(*bench_args(dropping, "--concurrency", 2, "--num-requests", 4, "--output-len", 8, "--json-out", out))
        assert done.code == 0, done.err
        assert json.loads(out.read_text())["requests"]["failed_by_cause"] == {"disconnected": 4}
    with start_sim_engine(model=SIM_MODEL, ttft_ms=5, itl_ms=2, stall_after_tokens=3) as stalling:
        out = tmp_path / "stall.json"
        done = cli(
            *bench_args(stalling, "--concurrency", 2, "--num-requests", 2, "--output-len", 8, "--timeout", 1, "--json-out", out)
        )
        assert done.code == 0, done.err
        assert json.loads(out.read_text())["requests"]["failed_by_cause"] == {"timeout": 2}
