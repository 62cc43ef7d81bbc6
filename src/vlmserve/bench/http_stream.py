"""A minimal HTTP/1.1 client for the bench's streamed POSTs, built on asyncio protocols.

Why not aiohttp here: on the bench's hot path every SSE chunk arrives on its own, and
aiohttp hands each one through a stream reader, a future and a task wake-up before our
code sees it. Here the socket's `data_received` callback hands the bytes to llhttp
(`vlmserve.http1.reader`, the same reader and framing rules as the gateway's replica
client), which de-chunks them synchronously; the payload of one read goes to the caller
in one call, with the arrival time taken once per read. Client CPU per chunk decides the
highest request rate one client core can drive (benchmarks/bench_client_capacity.py;
figures in docs/benchmarks.md).

What the gateway refuses from a replica, the bench refuses from a server (a chunk size
that is not plain hex, CL with TE, a repeated Content-Length, a header line without a
colon, obs-fold, bare LF, NUL, a 1xx, bytes after the response ...): the request fails
with `HttpProtocolError`, one line saying what was wrong, and the connection is dropped.

Scope, kept deliberately small: one request at a time per connection (no pipelining),
keep-alive reuse through `ConnectionPool`, `Content-Length`, chunked and read-until-close
bodies, http and https, no redirects, no compression (we never ask for it). Everything
else the bench does (probes, tokenizer, metrics scraping) stays on aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from vlmserve.http1.reader import ProtocolError, ResponseHead, ResponseReader

BodySink = Callable[[bytes, float], None]
"""Receives each piece of decoded response body and the perf_counter time it arrived."""

MAX_ERROR_BODY_BYTES = 64 * 1024
"""Of a non-200 answer's body, this much is kept for the error message."""

HttpProtocolError = ProtocolError
"""The server's answer was not HTTP/1.1 the project accepts (the shared reader's error, by the bench's name)."""


class ConnectionLost(Exception):
    """The connection closed before the response was complete."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: parsed once per run from the target URL."""

    host: str
    port: int
    tls: bool
    path: str
    host_header: str

    @classmethod
    def from_url(cls, url: str) -> "Endpoint":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        default_port = port == (443 if tls else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(host, port, tls, path, shown if default_port else f"{shown}:{port}")


class StreamResponse:
    """Status, headers and completion of one response; the body goes to the sink."""

    __slots__ = ("status", "headers", "done", "error_body", "written_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.done: asyncio.Future[None] = loop.create_future()
        self.error_body = bytearray()
        self.written_at: float | None = None
        """perf_counter time the request's last byte left our buffer for the kernel's (the upload's end)."""


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection: reads each response with the shared reader and feeds its body
    to a sink, one call per socket read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._response: StreamResponse | None = None
        self._sink: BodySink | None = None
        self._reader = ResponseReader(self)
        self._pieces: list[bytes] = []
        """Body payload llhttp found in the current read (one piece per chunk); delivered together."""
        self._ended = False
        self._got_bytes = False

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's subclasses
        # pause_writing/resume_writing as soon as anything waits in our buffer, and when it has
        # all gone: resume_writing then marks the moment a large body was fully written
        self.transport.set_write_buffer_limits(high=0, low=0)

    def pause_writing(self) -> None:
        """Part of the request still waits in our buffer (a large body): the upload goes on."""

    def resume_writing(self) -> None:
        response = self._response
        if response is not None and response.written_at is None:
            response.written_at = time.perf_counter()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        response = self._response
        if response is None or response.done.done():
            return
        if self._reader.feed_eof():  # a body delimited by the close has ended
            self._finish()
            return
        reason = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
        response.done.set_exception(ConnectionLost(reason, before_response=not self._got_bytes))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self._got_bytes = True
        response = self._response
        if response is not None and response.written_at is None:
            response.written_at = now  # the server answered before our buffer drained (an early error)
        pieces = self._pieces
        try:
            self._reader.feed(data)  # llhttp calls back into on_response_* from in here
        except ProtocolError as err:
            pieces.clear()
            self._fail(err)
            return
        if pieces:
            self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces), now)
            pieces.clear()
        if self._ended:  # only now: bytes after the end in the same read fail the request
            self._finish()

    # -- the reader's sink (called by llhttp from inside `feed`) --------------------------------
    def on_response_head(self, head: ResponseHead) -> None:
        response = self._response
        if response is not None:
            response.status = head.status
            response.headers = head.headers

    def on_response_body(self, data: bytes) -> None:
        self._pieces.append(data)

    def on_response_end(self) -> None:
        self._ended = True

    # -- one exchange ---------------------------------------------------------------------------
    def send(self, request: bytes, sink: BodySink) -> StreamResponse:
        """Write a complete request; the returned response's `done` resolves at the body's end."""
        assert self.transport is not None
        response = StreamResponse(asyncio.get_running_loop())
        self._response, self._sink = response, sink
        self._got_bytes = self._ended = self.reusable = False
        self._reader.expect()
        self.transport.write(request)
        if self.transport.get_write_buffer_size() == 0:
            response.written_at = time.perf_counter()
        return response

    def abort(self) -> None:
        """Drop the connection (timeout, cancellation, protocol error): it is never reused."""
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    # -- delivery ---------------------------------------------------------------------------------
    def _deliver(self, data: bytes, now: float) -> None:
        response = self._response
        if response is not None and response.status == 200 and self._sink is not None:
            self._sink(data, now)
        elif response is not None and len(response.error_body) < MAX_ERROR_BODY_BYTES:
            response.error_body += data

    def _finish(self) -> None:
        self._ended = False
        head = self._reader.head
        self.reusable = head is not None and head.keep_alive and not self.closed
        response = self._response
        if response is not None and not response.done.done():
            response.done.set_result(None)

    def _fail(self, err: Exception) -> None:
        response = self._response
        self.abort()
        if response is not None and not response.done.done():
            response.done.set_exception(err)


class ConnectionPool:
    """Idle keep-alive connections to one endpoint, reused last-in first-out."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self._idle: list[StreamConnection] = []
        self._ssl = ssl.create_default_context() if endpoint.tls else None
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self._head_prefix = (
            f"POST {endpoint.path} HTTP/1.1\r\nHost: {endpoint.host_header}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nAccept-Encoding: identity\r\n{extra}Content-Length: "
        ).encode("latin-1")

    def request_bytes(self, body: bytes, extra_headers: bytes = b"") -> bytes:
        """The whole request; `extra_headers` are complete header lines for this request alone (traceparent)."""
        if extra_headers:
            head = self._head_prefix[: -len(b"Content-Length: ")]
            return b"%s%sContent-Length: %d\r\n\r\n%s" % (head, extra_headers, len(body), body)
        return b"%s%d\r\n\r\n%s" % (self._head_prefix, len(body), body)

    async def connect(self) -> StreamConnection:
        loop = asyncio.get_running_loop()
        endpoint = self.endpoint
        _transport, protocol = await loop.create_connection(
            StreamConnection, endpoint.host, endpoint.port, ssl=self._ssl,
            server_hostname=endpoint.host if self._ssl else None,
        )
        return protocol

    def take_idle(self) -> StreamConnection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        return None

    def release(self, connection: StreamConnection) -> None:
        if connection.reusable and not connection.closed:
            self._idle.append(connection)
        else:
            connection.abort()

    def close(self) -> None:
        for connection in self._idle:
            connection.abort()
        self._idle.clear()


async def post_stream(pool: ConnectionPool, body: bytes, sink: BodySink, extra_headers: bytes = b"") -> StreamResponse:
    """POST `body` and feed the response body to `sink`; returns once the body has ended.

    The response's `written_at` says when the request's last byte was handed to the kernel
    (the client's view of the upload's end).

    A reused connection the server had already closed fails before any byte of the answer;
    that request is sent once more on a fresh connection (nothing reached the server's
    application, so this is not a retry of the request).
    """
    request = pool.request_bytes(body, extra_headers)
    connection = pool.take_idle()
    reused = connection is not None
    if connection is None:
        connection = await pool.connect()
    while True:
        response = connection.send(request, sink)
        try:
            await response.done
        except ConnectionLost as lost:
            if reused and lost.before_response:
                connection.abort()
                connection, reused = await pool.connect(), False
                continue
            connection.abort()
            raise
        except BaseException:
            connection.abort()  # timeout or cancellation mid-answer: never reuse a half-read stream
            raise
        pool.release(connection)
        return response
