"""ClientPool.send: a request leaves on a pooled connection at once; failures come from response().

Against a real asyncio server on a local socket: the request is on the wire before the caller
awaits anything, a pooled connection that the replica closes as the request goes out is retried
once on a fresh one, and what send() cannot do (a URL it cannot send to, a refused connect)
is raised by response(), where the forwarder handles every failure of an attempt.
"""

from __future__ import annotations

import asyncio

import pytest

from vlmserve.http1.client import ClientError, ClientPool

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Replica:
    """Answers each request with ANSWER; `drop_next` closes instead of answering the next one."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: asyncio.Queue[bytes] = asyncio.Queue()
        self.drop_next = False
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                await self.requests.put(head + body)
                if self.drop_next:
                    self.drop_next = False
                    writer.close()  # as a replica's idle timer closing just as the request came
                    return
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def test_the_request_is_on_the_wire_before_the_caller_awaits() -> None:
    replica = Replica()
    url = await replica.start()
    pool = ClientPool(connect_timeout_s=2)
    first = await pool.send("POST", url + "/v1/x", b"", b"{}").response()
    assert await first.read() == b"{}"  # the connection goes back to the pool
    sent = pool.send("POST", url + "/v1/x", b"X-Request-ID: r2\r\n", b'{"a":1}')
    await replica.requests.get()  # the first request's
    received = await asyncio.wait_for(replica.requests.get(), 2)  # sent.response() not awaited yet
    assert received.startswith(b"POST /v1/x HTTP/1.1\r\n") and received.endswith(
        b'X-Request-ID: r2\r\nContent-Length: 7\r\n\r\n{"a":1}'
    )
    assert (await (await sent.response()).read()) == b"{}"
    assert replica.connections == 1
    pool.close()


async def test_a_pooled_connection_closed_as_the_request_went_out_is_retried_on_a_fresh_one() -> None:
    replica = Replica()
    url = await replica.start()
    pool = ClientPool(connect_timeout_s=2)
    await (await pool.send("POST", url + "/v1/x", b"", b"{}").response()).read()
    replica.drop_next = True
    response = await pool.send("POST", url + "/v1/x", b"", b"{}").response()
    assert response.status == 200 and await response.read() == b"{}"
    assert replica.connections == 2  # the dropped one, then a fresh one
    pool.close()


async def test_what_send_cannot_do_is_raised_by_response() -> None:
    pool = ClientPool(connect_timeout_s=2)
    sent = pool.send("POST", "ftp://replica/v1/x", b"", b"{}")  # raises nothing here
    with pytest.raises(ClientError, match=r"cannot send to 'ftp://replica/v1/x': not an http\(s\) URL"):
        await sent.response()
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    sent = pool.send("POST", f"http://127.0.0.1:{port}/v1/x", b"", b"{}")
    with pytest.raises(ConnectionRefusedError):
        await sent.response()
    pool.close()


async def test_a_write_that_fails_is_raised_by_response_and_its_connection_is_not_pooled_again() -> None:
    replica = Replica()
    url = await replica.start()
    pool = ClientPool(connect_timeout_s=2)
    await (await pool.send("POST", url + "/v1/x", b"", b"{}").response()).read()
    (pooled,) = [c for idle in pool._idle.values() for c in idle]

    def broken_write(data: bytes) -> None:
        raise RuntimeError("transport is closing")

    pooled.transport.write = broken_write  # type: ignore[method-assign,union-attr]
    sent = pool.send("POST", url + "/v1/x", b"", b"{}")  # raises nothing here
    with pytest.raises(RuntimeError, match="transport is closing"):
        await sent.response()
    assert pooled.closed and not any(pool._idle.values())
    response = await pool.send("POST", url + "/v1/x", b"", b"{}").response()  # a fresh connection
    assert await response.read() == b"{}" and replica.connections == 2
    pool.close()
