"""ClientPool reading whole answers (error and unary ones) through the project's response reader,
against a real local server: bodies of each framing read whole, what keeps a connection out of the
pool, and a body cut short reported as such. The hostile framings are
test_replica_hostile_answers.py's."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.relay_harness import scripted_replica, send
from vlmserve.http1.client import ClientPool, ServerClosed

JSON = b'{"id": "cmpl-1", "choices": []}'
HEAD = b"Content-Type: application/json\r\nX-A: 1\r\nx-a: 2\r\n"


@pytest.mark.parametrize(
    ("answer", "pooled"),
    [
        (b"HTTP/1.1 200 OK\r\n" + HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(JSON), JSON), True),
        (
            b"HTTP/1.1 200 OK\r\n"
            + HEAD
            + b"Transfer-Encoding: chunked\r\n\r\n5\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (JSON[:5], len(JSON) - 5, JSON[5:]),
            True,
        ),
        (b"HTTP/1.1 200 OK\r\n" + HEAD + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(JSON), JSON), False),
        (b"HTTP/1.0 200 OK\r\n" + HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(JSON), JSON), False),  # 1.0: no keep-alive
        (b"HTTP/1.1 200 OK\r\n" + HEAD + b"\r\n" + JSON, False),  # ended by the close
    ],
    ids=["content-length", "chunked", "connection-close", "http-1.0", "close-delimited"],
)
async def test_a_whole_body_is_read_and_only_a_reusable_connection_is_pooled(answer: bytes, pooled: bool) -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, answer[:40], answer[40:], pause_s=0.02)
        if b"Content-Length" not in answer and b"chunked" not in answer:
            writer.close()  # the body's end

    pool = ClientPool(connect_timeout_s=2)
    try:
        async with scripted_replica(script, keep_alive=True) as replica:
            response = await pool.request("POST", replica.url + "/v1/x", b"", b"{}")
            assert response.status == 200 and response.headers["x-a"] == "1, 2"  # names lower-cased, repeats joined
            assert await asyncio.wait_for(response.read(), 5) == JSON
            await asyncio.sleep(0.05)
            assert sum(len(idle) for idle in pool._idle.values()) == (1 if pooled else 0)
    finally:
        pool.close()


@pytest.mark.hostile("a replica body cut before its last chunk: reported as incomplete, not as a whole body")
@pytest.mark.parametrize("cut", [b"3\r\nabc\r\n", b"3\r\nab", b"", b"Content-Length"])
async def test_a_body_cut_short_is_an_error_not_a_body(cut: bytes) -> None:
    head = (
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 10\r\n\r\n"
        if cut == b"Content-Length"
        else b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = b"abc" if cut == b"Content-Length" else cut

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, head + body, pause_s=0.05)
        writer.close()

    pool = ClientPool(connect_timeout_s=2)
    try:
        async with scripted_replica(script, keep_alive=True) as replica:
            response = await pool.request("POST", replica.url + "/v1/x", b"", b"{}")
            with pytest.raises(ServerClosed, match="the server closed the connection"):
                await asyncio.wait_for(response.read(), 5)
            assert not any(pool._idle.values())
    finally:
        pool.close()
