"""The bench's streamed POSTs, on the project's one HTTP/1.1 client (`vlmserve.http1.client`).

Why not aiohttp here: on the bench's hot path every SSE chunk arrives on its own, and aiohttp
hands each one through a stream reader, a future and a task wake-up before our code sees it.
The shared client hands the socket's bytes to llhttp from `data_received` and each de-chunked
piece of payload to a listener, synchronously; here the listener stamps it with its arrival time
and passes it to the caller's sink. Client CPU per chunk decides the highest request rate one
client core can drive (benchmarks/bench_client_capacity.py; figures in docs/benchmarks.md).

What the gateway refuses from a replica, the bench refuses from a server (a chunk size that is not
plain hex, CL with TE, a repeated Content-Length, a header line without a colon, obs-fold, bare
LF, NUL, a 1xx, bytes after the response ...): it is the same client and reader. The request fails
with `HttpProtocolError`, one line saying what was wrong, and the connection is dropped.
Everything else the bench does (probes, tokenizer, metrics scraping) stays on aiohttp.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vlmserve.http1.client import ClientError, ClientPool, MalformedResponse, SentRequest
from vlmserve.http1.headers import Headers, header_lines

BodySink = Callable[[bytes, float], None]
"""Receives each piece of decoded response body and the perf_counter time it arrived."""

MAX_ERROR_BODY_BYTES = 64 * 1024
"""Of a non-200 answer's body, this much is kept for the error message."""

HttpProtocolError = MalformedResponse
"""The server's answer was not HTTP/1.1 the project accepts (the shared client's error, by the bench's name)."""

ConnectionLost = ClientError
"""The connection failed or closed before the response was complete."""

CONNECT_TIMEOUT_S = 3600.0
"""Not the bound a connect has: the request's own timeout (`--request-timeout`) covers it."""


@dataclass
class StreamResponse:
    """Status and upload time of one response; its body went to the sink (an error body is kept here)."""

    status: int = 0
    headers: Headers = field(default_factory=Headers)
    written_at: float | None = None
    """perf_counter time the request's last byte left our buffer for the kernel's (the upload's end)."""
    error_body: bytearray = field(default_factory=bytearray)


class _SinkListener:
    """Takes a response's payload from the client as it arrives: to the sink when the status is
    200, else the first MAX_ERROR_BODY_BYTES into the error body."""

    __slots__ = ("sink", "sent", "error_body")

    def __init__(self, sink: BodySink) -> None:
        self.sink = sink
        self.sent: SentRequest | None = None  # its connection is the one the payload comes on
        self.error_body = bytearray()

    def payload(self, data: bytes) -> None:
        connection = self.sent.connection if self.sent is not None else None
        head = connection.reader.head if connection is not None else None  # in before any payload
        if head is not None and head.status == 200:
            self.sink(data, time.perf_counter())
        elif len(self.error_body) < MAX_ERROR_BODY_BYTES:
            self.error_body += data[: MAX_ERROR_BODY_BYTES - len(self.error_body)]

    def end(self) -> None:
        """The body's end is awaited by `post_stream` (ClientResponse.wait_end)."""

    def lost(self, error: BaseException | None) -> None:
        """Raised to `post_stream` by ClientResponse.wait_end."""


class ConnectionPool:
    """Keep-alive connections to one endpoint (a URL), with the headers every request carries."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.url = url
        self.client = ClientPool(connect_timeout_s)
        self.headers = header_lines(
            [
                ("Content-Type", "application/json"),
                ("Accept", "text/event-stream"),
                ("Accept-Encoding", "identity"),
                *(headers or {}).items(),
            ]
        )

    def close(self) -> None:
        self.client.close()


async def post_stream(pool: ConnectionPool, body: bytes, sink: BodySink, extra_headers: bytes = b"") -> StreamResponse:
    """POST `body` and feed the response body to `sink`; returns once the body has ended.
    `extra_headers` are complete header lines for this request alone (a traceparent)."""
    listener = _SinkListener(sink)
    sent = pool.client.send("POST", pool.url, pool.headers + extra_headers, body, listener)
    listener.sent = sent  # nothing arrives before the await below
    response = await sent.response()
    await response.wait_end()
    response.release()
    return StreamResponse(response.status, response.headers, response.connection.written_at, listener.error_body)
