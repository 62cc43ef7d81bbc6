"""A minimal HTTP/1.1 client for the bench's streamed POSTs, built on asyncio protocols.

Why not aiohttp here: on the bench's hot path every SSE chunk arrives on its own, and
aiohttp hands each one through a stream reader, a future and a task wake-up before our
code sees it. Here the socket's `data_received` callback decodes the chunked body and
hands complete lines to the caller synchronously, with the arrival time taken once per
read. At 1,400 req/s that took a worker from 44 % to 34 % of a core, and client CPU per
chunk decides the highest request rate one client core can drive
(benchmarks/bench_client_capacity.py; figures in docs/benchmarks.md).

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

BodySink = Callable[[bytes, float], None]
"""Receives each piece of decoded response body and the perf_counter time it arrived."""

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)
MAX_HEAD_BYTES = 64 * 1024


class HttpProtocolError(Exception):
    """The server's answer was not valid HTTP/1.1."""


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
    """One keep-alive connection: parses a response and feeds its body to a sink as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._response: StreamResponse | None = None
        self._sink: BodySink | None = None
        self._state = _DONE
        self._buffer = b""
        self._remaining = 0
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
        if self._state == _UNTIL_CLOSE:
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
        try:
            self._feed(data, now)
        except HttpProtocolError as err:
            self._fail(err)

    # -- one exchange ---------------------------------------------------------------------------
    def send(self, request: bytes, sink: BodySink) -> StreamResponse:
        """Write a complete request; the returned response's `done` resolves at the body's end."""
        assert self.transport is not None
        response = StreamResponse(asyncio.get_running_loop())
        self._response, self._sink = response, sink
        self._state, self._buffer, self._got_bytes, self.reusable = _HEAD, b"", False, False
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

    # -- parsing ----------------------------------------------------------------------------------
    def _feed(self, data: bytes, now: float) -> None:
        if self._state == _HEAD:
            data = self._buffer + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise HttpProtocolError("response headers larger than 64 KiB")
                self._buffer = data
                return
            self._parse_head(data[:end])
            data = data[end + 4 :]
            self._buffer = b""
        state = self._state
        if state == _LENGTH:
            take = data[: self._remaining]
            self._remaining -= len(take)
            if take:
                self._deliver(take, now)
            if self._remaining == 0:
                self._finish()
            return
        if state == _UNTIL_CLOSE:
            if data:
                self._deliver(data, now)
            return
        if state in (_CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS):
            self._feed_chunked(self._buffer + data if self._buffer else data, now)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise HttpProtocolError(f"not an HTTP/1.x response: {lines[0][:60]!r}")
        response = self._response
        assert response is not None
        try:
            response.status = int(status_line[1])
        except ValueError:
            raise HttpProtocolError(f"bad status line: {lines[0][:60]!r}") from None
        headers = response.headers
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        keep_alive = status_line[0] == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self._remaining = int(headers["content-length"])
            except ValueError:
                raise HttpProtocolError(f"bad Content-Length: {headers['content-length']!r}") from None
            self._state = _LENGTH
            if self._remaining == 0:
                self.reusable = keep_alive
                self._finish()
                return
        else:
            self._state = _UNTIL_CLOSE
            keep_alive = False
        self.reusable = keep_alive

    def _feed_chunked(self, data: bytes, now: float) -> None:
        """Decode chunked transfer encoding; pieces of one read are delivered together."""
        position, size = 0, len(data)
        pieces: list[bytes] = []
        state = self._state
        while position < size:
            if state == _CHUNK_SIZE:
                line_end = data.find(b"\r\n", position)
                if line_end < 0:
                    break
                try:
                    self._remaining = int(data[position:line_end].split(b";", 1)[0], 16)
                except ValueError:
                    raise HttpProtocolError(f"bad chunk size line: {data[position:line_end][:40]!r}") from None
                position = line_end + 2
                state = _CHUNK_DATA if self._remaining else _TRAILERS
            elif state == _CHUNK_DATA:
                take = min(self._remaining, size - position)
                pieces.append(data[position : position + take])
                position += take
                self._remaining -= take
                if self._remaining == 0:
                    state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if size - position < 2:
                    break
                if data[position : position + 2] != b"\r\n":
                    raise HttpProtocolError("chunk not followed by CRLF")
                position += 2
                state = _CHUNK_SIZE
            else:  # trailers, ended by an empty line
                line_end = data.find(b"\r\n", position)
                if line_end < 0:
                    break
                empty = line_end == position
                position = line_end + 2
                if empty:
                    state = _DONE
                    break
        self._state = state
        self._buffer = data[position:] if state != _DONE else b""
        if pieces:
            self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces), now)
        if state == _DONE:
            self._finish()

    def _deliver(self, data: bytes, now: float) -> None:
        response = self._response
        if response is not None and response.status == 200 and self._sink is not None:
            self._sink(data, now)
        elif response is not None and len(response.error_body) < MAX_HEAD_BYTES:
            response.error_body += data

    def _finish(self) -> None:
        self._state = _DONE
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
