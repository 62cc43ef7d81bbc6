"""The gateway's HTTP/1.1 client for the requests it forwards to replicas, on llhttp.

Each pooled keep-alive connection is an `asyncio.Protocol` that owns an `http1.reader.ResponseReader`:
the bytes from the replica's socket go into it as they arrive, and the response's head, pieces of
payload (de-chunked by llhttp) and end go, synchronously, to whoever reads the response now: the
task that waits for the head and then reads a whole body (error and unary answers), or the relay
(relay.py) for a stream, which the connection calls per piece of payload with no task wake-up.
Framing rules (what is refused) are http1's: this module parses nothing itself.

It speaks only what the gateway needs: one request at a time per connection, request bodies in
memory, keep-alive pooling per replica, HTTP and HTTPS. A connection whose response was malformed,
was not read to its end, or was followed by bytes after its end is closed, never reused.

Connections are reused. A reused connection can race with the replica closing it for being
idle (uvicorn closes idle connections after 5 s): a request that gets no response byte on a
reused connection is sent once more on a fresh one, transparently, as every HTTP client does.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Protocol
from urllib.parse import urlsplit

from vlmserve.http1.reader import ProtocolError, ResponseHead, ResponseReader

IDLE_KEEP_S = 30.0  # an idle pooled connection older than this is closed rather than reused


class UpstreamError(ConnectionError):
    """The replica's connection failed or sent something that is not HTTP/1.1."""


class UpstreamClosed(UpstreamError):
    """The replica closed the connection before the response was complete."""


class BodyListener(Protocol):
    """Who takes a response's body as it arrives (relay.py's StreamRelay)."""

    def payload(self, data: bytes) -> None: ...

    def end(self) -> None: ...

    def replica_lost(self, error: BaseException | None) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a replica: a request, its response head, then its body."""

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop  # set at connection_made
        self.reader = ResponseReader(self)
        self.closed = False
        self.idle_since = 0.0
        self.bytes_seen = False  # a byte of the current request's response has arrived
        # payload pieces llhttp appended during the current read (data_received), or received while
        # nobody takes them as they come; always this one list (its append is bound in the parser)
        self.body: list[bytes] = []
        self.listener: BodyListener | None = None  # takes the payload as it comes (the relay of a stream)
        self.waiter: asyncio.Future[None] | None = None  # the task reading the response (its head, or its end)
        self.error: BaseException | None = None  # why the connection failed; it is then never reused
        self.reading_paused = False

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        """llhttp appends the payload's pieces to `body` (C to C: `body.append` is the reader's
        on_body), and the head and end reach on_response_* below; a stream's relay then takes the
        pieces here, one call each: the hot path has no Python call per piece inside the parser."""
        self.bytes_seen = True
        try:
            self.reader.feed(data)
        except ProtocolError as err:
            self._deliver()  # the whole pieces before the fault first
            in_body = self.reader.head is not None
            self._fail(UpstreamError(f"sent a malformed {'body' if in_body else 'response'} ({err})"))
            return
        if self.body and self.listener is not None:
            self._deliver()

    def _deliver(self) -> None:
        """The payload pieces in hand, in order, to the listener (the relay), if one takes them."""
        listener = self.listener
        body = self.body
        if listener is None or not body:
            return
        if len(body) == 1:  # the common read: one chunk
            piece = body[0]
            body.clear()
            listener.payload(piece)
            return
        pieces = body[:]
        body.clear()
        for piece in pieces:
            listener.payload(piece)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reader = self.reader
        if exc is None and not reader.complete and reader.head is not None and reader.feed_eof():
            return  # a body delimited by the close has ended (on_response_end)
        if self.error is None and not reader.complete:
            self._fail(exc if exc is not None else UpstreamClosed("replica closed the connection"))

    def pause_reading(self) -> None:
        """Stop reading the replica (its client is slow): the kernel's buffers then hold it back."""
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    # ---- the reader's sink (http1.reader.ResponseSink) -------------------------------------------

    def on_response_head(self, head: ResponseHead) -> None:
        _wake(self.waiter)

    def on_response_body(self, data: bytes) -> None:
        self.body.append(data)  # not called: the reader is given body.append itself (write_request)

    def on_response_end(self) -> None:
        listener = self.listener
        if listener is not None:
            self._deliver()  # the pieces of this last read go before the end
            listener.end()
        _wake(self.waiter)

    def _fail(self, err: BaseException) -> None:
        """The connection is done for: never reused; whoever reads the response hears why."""
        if self.error is None:
            self.error = err
        if self.transport is not None:
            self.transport.close()
        listener = self.listener
        if listener is not None and not self.reader.complete:
            listener.replica_lost(self.error)
        _wake(self.waiter)

    # ---- used by SentRequest and UpstreamResponse ------------------------------------------------

    def write_request(self, data: bytes, body: bytes) -> None:
        """Send a request; the reader then expects its response from the next byte on."""
        self.bytes_seen = False
        self.reader.expect(self.body.append)
        transport = self.transport
        assert transport is not None
        if len(body) < 65536:
            transport.write(data + body)  # one write: the common request is one segment
        else:
            transport.writelines((data, body))

    async def wait(self, end: bool = False) -> ResponseHead | None:
        """Until the response head is in (with `end`: the whole response), then the head; raises
        what ended the connection before it."""
        reader = self.reader
        while not (reader.complete if end else reader.head is not None):
            if self.error is not None:
                raise self.error
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return reader.head

    def reusable(self) -> bool:
        """The response was read to its end, keep-alive holds, and nothing went wrong since."""
        head = self.reader.head
        return (self.reader.complete and head is not None and head.keep_alive and self.error is None
                and not self.closed and not self.reading_paused and self.listener is None)

    def close(self) -> None:
        self.listener = None
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class UpstreamResponse:
    """A response whose head has arrived; the body is read whole (`read`) or relayed (relay.py)."""

    def __init__(self, pool: UpstreamPool, connection: UpstreamConnection, head: ResponseHead) -> None:
        self._pool = pool
        self.connection = connection
        self.status = head.status
        self.headers = head.headers
        self._let_go = False  # released or closed: a connection must never be pooled twice

    async def read(self) -> bytes:
        """The whole body (de-chunked); the connection goes back to the pool."""
        connection = self.connection
        try:
            await connection.wait(end=True)
        except BaseException:
            self.close()
            raise
        body = b"".join(connection.body)
        connection.body.clear()
        self.release()
        return body

    def release(self) -> None:
        """Back to the pool when the body was read to its end and keep-alive holds; else closed."""
        if self._let_go:
            return
        if self.connection.reusable():
            self._let_go = True
            self._pool._give_back(self.connection)
        else:
            self.close()

    def close(self) -> None:
        """Close the connection: a replica streaming an answer sees the disconnect and aborts it."""
        if not self._let_go:
            self._let_go = True
            self.connection.close()


class SentRequest:
    """A request given to `UpstreamPool.send`: written on a pooled connection, or to be written on
    a new one; `response` waits for its head."""

    __slots__ = ("pool", "key", "head", "body", "connection", "reused", "error")

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.key: tuple[str, str, int] = ("", "", 0)
        self.head = b""
        self.body = b""
        self.connection: UpstreamConnection | None = None  # the connection it was written on
        self.reused = False
        self.error: Exception | None = None  # what send() could not do, raised by response()

    def write_on(self, connection: UpstreamConnection, *, reused: bool) -> None:
        self.connection, self.reused = connection, reused
        connection.write_request(self.head, self.body)

    async def response(self) -> UpstreamResponse:
        """The response head (see UpstreamPool.send). A reused connection that the replica
        closed as the request went out gets it once more on a fresh one (module docstring)."""
        if self.error is not None:
            if self.connection is not None:
                self.connection.close()  # the write on it failed: never pooled again
            raise self.error
        while True:
            connection = self.connection
            if connection is None:
                connection = await self.pool._connect(self.key)
                self.write_on(connection, reused=False)
            try:
                head = await connection.wait()
            except ConnectionError:
                self.connection = None
                connection.close()
                if self.reused and not connection.bytes_seen:
                    continue  # the replica closed (or reset) this idle connection as we sent: a fresh one
                raise
            except BaseException:
                connection.close()
                raise
            assert head is not None  # wait() returns once the head is in
            return UpstreamResponse(self.pool, connection, head)


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

    def send(self, method: str, url: str, headers: bytes, body: bytes) -> SentRequest:
        """Write one request now when an idle pooled connection to its replica is at hand (else at
        `SentRequest.response`), so that it leaves before the caller's bookkeeping. Raises nothing:
        a failure is raised by `response`, where the caller handles every failure of the attempt.

        `headers` are header lines ready to send (`Name: value\r\n` each, http1.headers.header_lines),
        so that the caller builds its fixed ones once; Host and Content-Length are added here."""
        sent = SentRequest(self)
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

    async def request(self, method: str, url: str, headers: bytes, body: bytes) -> UpstreamResponse:
        """Send one request and wait for the response head (not the body)."""
        return await self.send(method, url, headers, body).response()

    def _take_idle(self, key: tuple[str, str, int]) -> UpstreamConnection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.closed or connection.error is not None:
                continue
            if connection.loop.time() - connection.idle_since > IDLE_KEEP_S:
                connection.close()
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
            connection.close()
            return
        connection.body.clear()
        connection.idle_since = connection.loop.time()
        self._idle.setdefault(connection.key, []).append(connection)

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
