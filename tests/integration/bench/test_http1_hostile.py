"""Hostile answers to the bench's stream client, from a raw asyncio server: the bench refuses what
the gateway refuses (the shared case list, tests/helpers/http1_cases.py), says in one line what was
wrong, and never sends another request on the connection that carried a refused answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from tests.helpers.http1_cases import BODY, CASES, GOOD, ResponseCase, case_id, head_splits, payload_before_refusal
from vlmserve.bench.client import stream_request
from vlmserve.bench.http_stream import ConnectionPool, HttpProtocolError, post_stream
from vlmserve.results.records import RequestRecord

REFUSED = [
    pytest.param(case, id=case_id(case), marks=pytest.mark.hostile(f"bench client, from a server: {case.name}"))
    for case in CASES
    if case.refused
]
ACCEPTED = [pytest.param(case, id=case_id(case)) for case in CASES if not case.refused]

Answer = Callable[[int, int], bytes]
"""The bytes to write for (connection index, request index on that connection)."""


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


@asynccontextmanager
async def _server(
    answer: Answer, late: bytes = b"", late_sent: asyncio.Event | None = None
) -> AsyncIterator[tuple[ConnectionPool, list[int]]]:
    """A raw server answering each request with `answer(...)`, keeping every connection open;
    yields a pool to it and the number of requests each accepted connection carried. `late`:
    bytes written, unasked, on the first connection a moment after its first answer."""
    requests: list[int] = []
    handlers: set[asyncio.Task] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            handlers.add(task)
        index = len(requests)
        requests.append(0)
        try:
            while True:
                await _read_request(reader)
                requests[index] += 1
                writer.write(answer(index, requests[index] - 1))
                await writer.drain()
                if late and index == 0 and requests[index] == 1:
                    await asyncio.sleep(0.05)
                    writer.write(late)
                    if late_sent is not None:
                        late_sent.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool(f"http://127.0.0.1:{port}/v1/completions")
    try:
        yield pool, requests
    finally:
        pool.close()
        server.close()
        if handlers:  # each ends on its connection's close; a handler cancelled at the loop's end
            await asyncio.wait(handlers, timeout=2)  # would make Python 3.11's asyncio log a traceback
        await server.wait_closed()


def _appender(pieces: list[bytes]) -> Callable[[bytes, float], None]:
    """A body sink that keeps the pieces."""
    return lambda data, _now: pieces.append(data)


async def _request(pool: ConnectionPool) -> RequestRecord:
    """One request through the bench's own path (client.stream_request): what a run records."""
    record = RequestRecord("r", 0.0, 0.0)
    await stream_request(pool, b"{}", record, clock_offset=0.0, timeout_s=5)
    return record


@pytest.mark.parametrize("case", REFUSED)
async def test_a_refused_answer_fails_its_request_in_one_line_and_its_connection_is_dropped(case: ResponseCase) -> None:
    """As at the gateway: an answer whose whole body came before what is refused (bytes after its
    end) is kept, and only its connection is dropped."""
    async with _server(lambda connection, _request: case.response if connection == 0 else GOOD) as (pool, requests):
        refused = await _request(pool)
        if payload_before_refusal(case) == case.body:
            assert refused.ok, refused.error_message
        else:
            assert refused.error_kind == "protocol_error" and not refused.ok
            message = refused.error_message or ""
            assert case.error is not None and case.error in message, message
            assert "\n" not in message and "Traceback" not in message
        after = await _request(pool)  # the next request: a fresh connection, answered well
        assert after.ok, after.error_message
    assert requests == [1, 1]


async def test_post_stream_raises_the_readers_error() -> None:
    case = CASES[0]
    async with _server(lambda _connection, _request: case.response) as (pool, _requests):
        with pytest.raises(HttpProtocolError, match=case.error):
            await post_stream(pool, b"{}", lambda _data, _now: None)


@pytest.mark.parametrize("case", ACCEPTED)
async def test_an_accepted_answer_is_read_whole_and_its_connection_reused(case: ResponseCase) -> None:
    async with _server(lambda _connection, _request: case.response) as (pool, requests):
        for _ in range(2):
            pieces: list[bytes] = []
            response = await post_stream(pool, b"{}", _appender(pieces))
            assert response.status == 200 and b"".join(pieces) == case.body
            assert {name: response.headers.get(name) for name in case.headers} == case.headers
    assert requests == [2]


@pytest.mark.hostile("bench client, from a server: bytes after the response, arriving while the connection is idle")
async def test_bytes_on_an_idle_connection_drop_it_from_the_pool() -> None:
    sent_late = asyncio.Event()

    def answer(connection: int, _request: int) -> bytes:
        return GOOD

    async with _server(answer, late=b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", late_sent=sent_late) as (pool, requests):
        first = await _request(pool)
        assert first.ok, first.error_message
        (idle,) = [connection for idle in pool.client._idle.values() for connection in idle]
        assert idle.reusable()
        await sent_late.wait()
        await asyncio.sleep(0.05)
        assert idle.closed and not idle.reusable()
        second = await _request(pool)
        assert second.ok, second.error_message
    assert requests == [1, 1]


@pytest.mark.hostile("bench client, from a server: a response head split at every byte boundary")
async def test_a_head_split_at_every_byte_boundary_reads_as_the_whole_head() -> None:
    splits = list(head_splits(GOOD))

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for first, rest in [(GOOD, b"")] + splits:
                await _read_request(reader)
                writer.write(first)
                await writer.drain()
                await asyncio.sleep(0.002)  # the second part in a later read (TCP_NODELAY is asyncio's default)
                writer.write(rest)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    pool = ConnectionPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions")
    seen = []
    try:
        for _ in range(len(splits) + 1):
            pieces: list[bytes] = []
            response = await post_stream(pool, b"{}", _appender(pieces))
            seen.append((response.status, dict(response.headers), b"".join(pieces)))
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
    whole = seen[0]
    assert whole[0] == 200 and whole[2] == BODY and whole[1]["transfer-encoding"] == "chunked"
    assert all(split == whole for split in seen[1:])
