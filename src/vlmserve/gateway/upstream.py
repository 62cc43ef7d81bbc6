"""A lean HTTP/1.1 client for the requests the gateway forwards to replicas.

Why not aiohttp's client here: a streamed answer of a few hundred chunks went, per chunk,
through aiohttp's parser, its StreamReader, a task wake-up and a coroutine chain, which
profiling showed to be most of the gateway's CPU per chunk. This client is an
`asyncio.Protocol`: until the response's first body bytes are in hand it behaves like any
client (status, headers, whole bodies for error and unary answers), and then `relay.py`
takes the connection over (`set_protocol`) and gets its bytes straight from the event loop, still chunk-framed, and passes
them on. It speaks only what the gateway needs: one request at a time per connection, bodies
in memory, keep-alive pooling per replica, HTTP and HTTPS.

Connections are reused. A reused connection can race with the replica closing it for being
idle (uvicorn closes idle connections after 5 s): a request that gets no response byte on a
reused connection is sent once more on a fresh one, transparently, as every HTTP client does.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # status line and headers
IDLE_KEEP_S = 30.0  # an idle pooled connection older than this is closed rather than reused
_ASCII_SPACE = " \t\r\n\x0b\x0c"  # what bytes.strip() strips; str.strip() would also strip latin-1's NBSP


class UpstreamError(ConnectionError):
    """The replica's connection failed or sent something that is not HTTP/1.1."""


class UpstreamClosed(UpstreamError):
    """The replica closed the connection before the response was complete."""


# How a replica's broken stream is worded, by either relay (relay.py, native_pump.py)
SIZE_LINE_TOO_LONG = "chunk size line too long"
NO_CRLF_AFTER_CHUNK = "chunk not followed by CRLF"


def bad_size_line(line: bytes) -> str:
    return f"bad chunk size line {bytes(line[:40])!r}"


def malformed_body(detail: object) -> str:
    return f"sent a malformed body ({detail})"


def lost_mid_stream(error_name: str | None) -> str:
    """A replica connection that ended (None: closed) or failed (the exception's name) mid-body."""
    return "closed the connection mid-stream" if error_name is None else f"failed mid-stream ({error_name})"


# RFC 9112's chunk-size (hex digits, at most 15 here) with blanks and an extension allowed after
# it; int(x, 16) alone would also take "0x1a", "+1a" and "1_a", which no engine writes and a
# smuggling replica might. The native pump (_native_relay.c, parse_size) accepts the same lines.
_SIZE_LINE = re.compile(rb"[ \t]*([0-9a-fA-F]{1,15})[ \t]*(?:;.*)?", re.DOTALL)


def walk_frames(data: bytes, payload: list[bytes] | None = None) -> tuple[int, int]:
    """Walk chunked transfer framing in `data`, which starts at a frame boundary.

    Returns `(boundary, end)`: `boundary` is where the last complete data frame ends (the
    relay passes `data[:boundary]` on and holds the rest until it completes, so a stream the
    gateway has to cut always ends on a frame boundary); `end` is where the body ends, past the
    terminating zero-size chunk and its trailers, or -1 while that has not been seen whole. The
    frames' payload is appended to `payload` when one is given. No payload byte is copied
    otherwise: the common block (one whole frame) costs a `find` and an `int`.
    """
    i = 0
    n = len(data)
    while True:
        eol = data.find(b"\r\n", i)
        if eol < 0:
            if n - i > 1024:
                raise UpstreamError(SIZE_LINE_TOO_LONG)
            return i, -1
        line = data[i:eol]
        match = _SIZE_LINE.fullmatch(line)
        if match is None:
            raise UpstreamError(bad_size_line(line))
        size = int(match.group(1), 16)
        if size == 0:
            if data.startswith(b"\r\n", eol + 2):
                return i, eol + 4
            trailers_end = data.find(b"\r\n\r\n", eol + 2)
            return i, (-1 if trailers_end < 0 else trailers_end + 4)
        following = eol + 2 + size
        if following + 2 > n:
            return i, -1
        if data[following:following + 2] != b"\r\n":
            raise UpstreamError(NO_CRLF_AFTER_CHUNK)
        if payload is not None:
            payload.append(data[eol + 2:following])
        i = following + 2


def decode_chunked(raw: bytes) -> bytes:
    """The payload of a complete chunked body."""
    parts: list[bytes] = []
    _, end = walk_frames(raw, parts)
    if end < 0:
        raise UpstreamClosed("chunked body ended before its last chunk")
    return b"".join(parts)


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a replica: a request, its response head, then its body."""

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop  # set at connection_made
        self.closed = False
        self.used = False  # has carried a request before (so it may have been closed by an idle timer)
        self.idle_since = 0.0
        self._head = bytearray()
        self._head_waiter: asyncio.Future[None] | None = None
        self.head_bytes_seen = False
        # a stream's caller waits once for the head and the first body bytes: one task wake-up, not two
        self.head_with_body = False
        self.body: list[bytes] = []  # body bytes received and not yet consumed
        self._body_waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.status = 0
        self.http10 = False
        self.headers: dict[str, str] = {}
        # set while a relay holds the transport (relay.py takes it over with set_protocol): told of the close
        self.sink_lost: Callable[[BaseException | None], None] | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.status == 0:
            self._head += data
            self.head_bytes_seen = True
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEAD_BYTES:
                    self._fail(UpstreamError(f"response head over {MAX_HEAD_BYTES} bytes"))
                return
            try:
                self._parse_head(bytes(self._head[:end]))
            except UpstreamError as err:
                self._fail(err)
                return
            rest = bytes(self._head[end + 4:])
            self._head = bytearray()
            if rest:
                self.body.append(rest)
            if rest or not self.head_with_body or self.status != 200:
                _wake(self._head_waiter)
            return
        self.body.append(data)
        _wake(self._body_waiter)
        _wake(self._head_waiter)  # waiting for a 200's first body bytes (head_with_body)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.sink_lost is not None:
            lost, self.sink_lost = self.sink_lost, None
            lost(exc)
            return
        self.error = exc if exc is not None else UpstreamClosed("replica closed the connection")
        for waiter in (self._head_waiter, self._body_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # ---- used by UpstreamResponse ----------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        # decoded once (latin-1 maps every byte to one character), then split as text
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if (len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isascii()
                or not parts[1].isdigit()):
            raise UpstreamError(f"not an HTTP/1.1 response: {lines[0][:60].encode('latin-1')!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise UpstreamError(f"malformed response header line {line[:60].encode('latin-1')!r}")
            key = name.strip(_ASCII_SPACE).lower()
            text = value.strip(_ASCII_SPACE)
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if 100 <= status < 200:
            raise UpstreamError(f"unexpected informational response {status}")
        self.headers = headers
        self.status = status
        self.http10 = parts[0] == "HTTP/1.0"

    def _fail(self, err: BaseException) -> None:
        self.error = err
        if self.transport is not None:
            self.transport.close()
        for waiter in (self._head_waiter, self._body_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def wait_head(self) -> None:
        """Until the head is in (with `head_with_body`, a 200's first body bytes too, or the close)."""
        while self.status == 0 or (self.head_with_body and self.status == 200 and not self.body
                                   and not self.closed and self.error is None):
            if self.status == 0 and self.error is not None:
                raise self.error
            self._head_waiter = self.loop.create_future()
            await self._head_waiter
            self._head_waiter = None

    async def wait_body(self) -> bool:
        """Until there are unread body bytes (True) or the connection is gone (False)."""
        while not self.body:
            if self.closed or self.error is not None:
                return False
            self._body_waiter = self.loop.create_future()
            await self._body_waiter
            self._body_waiter = None
        return True

    def reset(self) -> None:
        """Ready for the next request on this connection."""
        self.status = 0
        self.headers = {}
        self.body = []
        self.head_bytes_seen = False
        self.head_with_body = False
        self.sink_lost = None


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class UpstreamResponse:
    """A response whose head has arrived; the body is read whole (`read`) or relayed (relay.py)."""

    def __init__(self, pool: UpstreamPool, connection: UpstreamConnection) -> None:
        self._pool = pool
        self.connection = connection
        self.status = connection.status
        self.headers = connection.headers
        encoding = self.headers.get("transfer-encoding", "").lower()
        self.chunked = "chunked" in encoding
        length = self.headers.get("content-length")
        self.length: int | None = None if self.chunked or length is None or not length.isdigit() else int(length)
        self.keep_alive = (not connection.http10
                           and "close" not in self.headers.get("connection", "").lower()
                           and (self.chunked or self.length is not None))
        self._finished = False
        self._let_go = False  # released or closed: a connection must never be pooled twice

    async def read(self) -> bytes:
        """The whole body (de-chunked); the connection goes back to the pool."""
        connection = self.connection
        raw = b""
        while True:
            if connection.body:
                raw += b"".join(connection.body)
                connection.body = []
            if self.chunked:
                _, end = walk_frames(raw)
                if end >= 0:
                    if end < len(raw):
                        self.keep_alive = False  # bytes after the body: do not trust this connection again
                    body = decode_chunked(raw[:end])
                    break
            elif self.length is not None and len(raw) >= self.length:
                if len(raw) > self.length:
                    self.keep_alive = False
                body = raw[: self.length]
                break
            if not await connection.wait_body():
                if not self.chunked and self.length is None:
                    body = raw  # delimited by the close
                    break
                self.close()
                raise connection.error or UpstreamClosed("replica closed the connection mid-body")
        self._finished = True
        self.release()
        return body

    async def first_block(self) -> bytes:
        """The first body bytes as they came (still chunk-framed if chunked); b"" for an empty body.

        Raises UpstreamClosed when the connection ends first (as aiohttp's client does)."""
        connection = self.connection
        if not connection.body and not await connection.wait_body():
            if not self.chunked and self.length is None and isinstance(connection.error, UpstreamClosed):
                return b""  # a body delimited by the close, and empty
            raise connection.error or UpstreamClosed("replica closed the connection before the body")
        return self.take_first_block()

    @property
    def body_buffered(self) -> bool:
        """Body bytes are in hand (a stream's head arrives with its first ones: `head_with_body`)."""
        return bool(self.connection.body)

    def take_first_block(self) -> bytes:
        """`first_block` when `body_buffered`, without a coroutine."""
        connection = self.connection
        block = b"".join(connection.body)  # one block (the common case) is returned as it is, not copied
        connection.body = []
        if self.chunked and block.startswith(b"0\r\n") or self.length == 0:
            return b""  # an empty body: nothing to stream
        return block

    def finished(self) -> None:
        """The relay read the body to its end: the connection may be reused."""
        self._finished = True

    def release(self) -> None:
        """Back to the pool when the body was read to its end and keep-alive holds; else closed."""
        if self._let_go:
            return
        connection = self.connection
        if self._finished and self.keep_alive and not connection.closed:
            self._let_go = True
            self._pool._give_back(connection)
        else:
            self.close()

    def close(self) -> None:
        """Close the connection: a replica streaming an answer sees the disconnect and aborts it."""
        if self._let_go:
            return
        self._let_go = True
        connection = self.connection
        connection.sink_lost = None
        if connection.transport is not None and not connection.closed:
            connection.transport.close()
        connection.closed = True


class SentRequest:
    """A request given to `UpstreamPool.send`: written on a pooled connection, or to be written on
    a new one; `response` waits for its head."""

    __slots__ = ("pool", "head_with_body", "key", "head", "body", "connection", "reused", "error")

    def __init__(self, pool: UpstreamPool, head_with_body: bool) -> None:
        self.pool = pool
        self.head_with_body = head_with_body
        self.key: tuple[str, str, int] = ("", "", 0)
        self.head = b""
        self.body = b""
        self.connection: UpstreamConnection | None = None  # the connection it was written on
        self.reused = False
        self.error: Exception | None = None  # what send() could not do, raised by response()

    def write_on(self, connection: UpstreamConnection, *, reused: bool) -> None:
        self.connection, self.reused = connection, reused
        connection.used = True
        connection.head_with_body = self.head_with_body
        transport = connection.transport
        assert transport is not None
        body = self.body
        if len(body) < 65536:
            transport.write(self.head + body)  # one write: the common request is one segment
        else:
            transport.writelines((self.head, body))

    async def response(self) -> UpstreamResponse:
        """The response head (see UpstreamPool.request). A reused connection that the replica
        closed as the request went out gets it once more on a fresh one (module docstring)."""
        if self.error is not None:
            if self.connection is not None:
                _close(self.connection)  # the write on it failed: never pooled again
            raise self.error
        while True:
            connection = self.connection
            if connection is None:
                connection = await self.pool._connect(self.key)
                self.write_on(connection, reused=False)
            try:
                await connection.wait_head()
            except ConnectionError:
                self.connection = None
                _close(connection)
                if self.reused and not connection.head_bytes_seen:
                    continue  # the replica closed (or reset) this idle connection as we sent: a fresh one
                raise
            except BaseException:
                _close(connection)
                raise
            return UpstreamResponse(self.pool, connection)


def _close(connection: UpstreamConnection) -> None:
    if connection.transport is not None:
        connection.transport.close()
    connection.closed = True


class UpstreamPool:
    """Keep-alive connections to the replicas, any number per replica (admission limits that)."""

    def __init__(self, connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[UpstreamConnection]] = {}
        self._targets: dict[str, tuple[tuple[str, str, int], bytes]] = {}
        self._closed = False

    def _target(self, url: str) -> tuple[tuple[str, str, int], bytes]:
        """(scheme, host, port) and the request-line path of an absolute URL (parsed once per URL)."""
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UpstreamError(f"cannot forward to {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host_header = parts.netloc.rpartition("@")[2]
            target = ((parts.scheme, parts.hostname, port), f" {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1"))
            if len(self._targets) < 4096:
                self._targets[url] = target
        return target

    def send(self, method: str, url: str, headers: bytes, body: bytes, head_with_body: bool = False) -> SentRequest:
        """Write one request now when an idle pooled connection to its replica is at hand (else at
        `SentRequest.response`), so that it leaves before the caller's bookkeeping. Raises nothing:
        a failure is raised by `response`, where the caller handles every failure of the attempt.

        `headers` are header lines ready to send (`Name: value\r\n` each, lean_http.header_lines),
        so that the caller builds its fixed ones once; Host and Content-Length are added here."""
        sent = SentRequest(self, head_with_body)
        try:
            sent.key, path_and_host = self._target(url)
            sent.head = b"%s%s%sContent-Length: %d\r\n\r\n" % (method.encode("ascii"), path_and_host, headers, len(body))
            sent.body = body
            connection = self._take_idle(sent.key)
            if connection is not None:
                sent.write_on(connection, reused=True)
        except Exception as err:  # noqa: BLE001 - raised again by response(), inside the caller's handling
            sent.error = err
        return sent

    async def request(self, method: str, url: str, headers: bytes, body: bytes,
                      head_with_body: bool = False) -> UpstreamResponse:
        """Send one request and wait for the response head (not the body; with `head_with_body`,
        a 200's first body bytes too: a stream then starts on one wake-up)."""
        return await self.send(method, url, headers, body, head_with_body).response()

    def _take_idle(self, key: tuple[str, str, int]) -> UpstreamConnection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.closed:
                continue
            if connection.loop.time() - connection.idle_since > IDLE_KEEP_S:
                assert connection.transport is not None
                connection.transport.close()
                continue
            return connection
        return None

    async def _connect(self, key: tuple[str, str, int]) -> UpstreamConnection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            context = self._ssl_context
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConnection(key), host, port, ssl=context),
                self.connect_timeout_s,
            )
        except asyncio.TimeoutError:
            raise UpstreamError(f"connect to {host}:{port} timed out after {self.connect_timeout_s:g} s") from None
        return protocol

    def _give_back(self, connection: UpstreamConnection) -> None:
        if self._closed:
            assert connection.transport is not None
            connection.transport.close()
            return
        connection.reset()
        connection.idle_since = connection.loop.time()
        self._idle.setdefault(connection.key, []).append(connection)

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()
