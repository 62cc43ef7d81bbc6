"""The project's one HTTP/1.1 client: the gateway's replica connections and the bench's load.

Each pooled keep-alive connection is an `asyncio.Protocol` that owns an `http1.reader.ResponseReader`:
the bytes from the socket go into it as they arrive, and the response's head, pieces of payload
(de-chunked by llhttp) and end go, synchronously, to whoever reads the response now: the task that
waits for the head and then reads a whole body (`ClientResponse.read`), or a `BodyListener` (the
gateway's stream relay, the bench's SSE reader), which the connection calls per piece of payload
with no task wake-up. Framing rules (what is refused) are the reader's: this module parses nothing.

It speaks only what its two users need: one request at a time per connection, request bodies in
memory, keep-alive pooling per (scheme, host, port), HTTP and HTTPS. A connection whose response
was malformed, was not read to its end, or was followed by bytes after its end is closed, never
reused.

A reused connection can race with the server closing it for being idle (uvicorn closes idle
connections after 5 s): a request that gets no response byte on a reused connection is sent once
more on a fresh one, transparently, as every HTTP client does (nothing reached the server's
application, so this is not a retry of the request).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit

from vlmserve.http1.reader import ProtocolError, ResponseHead, ResponseReader

IDLE_KEEP_S = 30.0  # an idle pooled connection older than this is closed rather than reused


class ClientError(ConnectionError):
    """The server's connection failed, or the request could not be sent."""


class MalformedResponse(ClientError):
    """The server sent something that is not HTTP/1.1 the reader accepts (the message says what)."""


class ServerClosed(ClientError):
    """The server closed the connection before the response was complete."""


class AnswerTooLarge(ClientError):
    """The server's answer went over what its reader keeps (CappedBody); the message says the limit."""


class BodyListener(Protocol):
    """Who takes a response's body as it arrives (the gateway's stream relay, the bench's SSE reader).
    One given at `ClientPool.send` hears the body from its first byte; the head (`connection.reader.head`)
    is in before any payload."""

    def payload(self, data: bytes) -> None: ...

    def end(self) -> None: ...

    def lost(self, error: BaseException | None) -> None: ...


class ClientConnection(asyncio.Protocol):
    """One keep-alive connection to a server: a request, its response head, then its body."""

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
        self.listener: BodyListener | None = None  # takes the payload as it comes
        self.waiter: asyncio.Future[None] | None = None  # the task reading the response (its head, or its end)
        self.error: BaseException | None = None  # why the connection failed; it is then never reused
        self.reading_paused = False
        # perf_counter time the current request's last byte left for the kernel (the upload's end)
        self.written_at: float | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # resume_writing once the buffer is empty: it marks when a large body was all written
        transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        """Part of the request still waits in the buffer (a large body): the upload goes on."""

    def resume_writing(self) -> None:
        if self.written_at is None:
            self.written_at = time.perf_counter()

    def data_received(self, data: bytes) -> None:
        """llhttp appends the payload's pieces to `body` (C to C: `body.append` is the reader's
        on_body), and the head and end reach on_response_* below; a listener then takes the
        pieces here, one call each: the hot path has no Python call per piece inside the parser."""
        self.bytes_seen = True
        try:
            self.reader.feed(data)
        except ProtocolError as err:
            self.deliver()  # the whole pieces before the fault first
            in_body = self.reader.head is not None
            self._fail(MalformedResponse(f"sent a malformed {'body' if in_body else 'response'} ({err})"))
            return
        if self.body and self.listener is not None:
            self.deliver()

    def deliver(self) -> None:
        """The payload pieces in hand, to the listener if one takes them, in one call: the chunks of
        one read arrived together (the bench stamps them with one time; the relay writes them out in
        one write)."""
        listener = self.listener
        body = self.body
        if listener is None or not body:
            return
        if self.written_at is None:
            self.written_at = time.perf_counter()  # answered before the buffer drained (an early error)
        data = body[0] if len(body) == 1 else b"".join(body)  # the common read: one chunk
        body.clear()
        listener.payload(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reader = self.reader
        if exc is None and not reader.complete and reader.head is not None and reader.feed_eof():
            return  # a body delimited by the close has ended (on_response_end)
        if self.error is None and not reader.complete:
            why = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
            self._fail(ServerClosed(f"the server closed the connection{why}"))

    def pause_reading(self) -> None:
        """Stop reading the server (whoever takes the body is slow): the kernel's buffers hold it back."""
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
            self.deliver()  # the pieces of this last read go before the end
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
            listener.lost(self.error)
        _wake(self.waiter)

    # ---- used by SentRequest and ClientResponse ------------------------------------------------

    def write_request(self, data: bytes, body: bytes) -> None:
        """Send a request; the reader then expects its response from the next byte on."""
        self.bytes_seen = False
        self.written_at = None
        self.reader.expect(self.body.append)
        transport = self.transport
        assert transport is not None
        if len(body) < 65536:
            transport.write(data + body)  # one write: the common request is one segment
        else:
            transport.writelines((data, body))
        if transport.get_write_buffer_size() == 0:
            self.written_at = time.perf_counter()

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
        return (
            self.reader.complete
            and head is not None
            and head.keep_alive
            and self.error is None
            and not self.closed
            and not self.reading_paused
        )

    def close(self) -> None:
        self.listener = None
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class CappedBody:
    """A BodyListener that keeps a response's body up to `limit` bytes and closes the connection past
    it, at once: `ClientResponse.read` keeps all it is sent, so a server not trusted with the reader's
    memory (a replica's /metrics) is read through this. Give it to `ClientPool.send` and set `sent`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.pieces: list[bytes] = []
        self.sent: SentRequest | None = None  # the request whose connection is closed past the limit

    def whole(self) -> bytes:
        """The body; AnswerTooLarge when it went over the limit. Ask once the read has ended, whether
        it failed (ServerClosed, when this closed it) or not (a body the close delimits then ends whole)."""
        if self.size > self.limit:
            raise AnswerTooLarge(f"over {self.limit:,} bytes")
        return b"".join(self.pieces)

    def payload(self, data: bytes) -> None:
        self.size += len(data)
        if self.size <= self.limit:
            self.pieces.append(data)
        elif self.sent is not None and self.sent.connection is not None:
            self.sent.connection.close()  # the read ends (ServerClosed) without waiting for the rest

    def end(self) -> None:
        pass

    def lost(self, error: BaseException | None) -> None:
        pass


class ClientResponse:
    """A response whose head has arrived; the body is read whole (`read`) or taken by a listener."""

    def __init__(self, pool: ClientPool, connection: ClientConnection, head: ResponseHead) -> None:
        self._pool = pool
        self.connection = connection
        self.status = head.status
        self.headers = head.headers
        self._let_go = False  # released or closed: a connection must never be pooled twice

    async def read(self) -> bytes:
        """The whole body (de-chunked); the connection goes back to the pool."""
        await self.wait_end()
        connection = self.connection
        body = b"".join(connection.body)
        connection.body.clear()
        self.release()
        return body

    async def wait_end(self) -> None:
        """Until the body has ended (taken by a listener, or kept for `read`); a failure closes the
        connection and is raised."""
        try:
            await self.connection.wait(end=True)
        except BaseException:
            self.close()
            raise

    def release(self) -> None:
        """Back to the pool when the body was read to its end and keep-alive holds; else closed.
        The listener, if any, hears nothing more."""
        if self._let_go:
            return
        self.connection.listener = None
        if self.connection.reusable():
            self._let_go = True
            self._pool._give_back(self.connection)
        else:
            self.close()

    def close(self) -> None:
        """Close the connection: a server streaming an answer (vLLM) sees the disconnect and aborts it."""
        if not self._let_go:
            self._let_go = True
            self.connection.close()


class SentRequest:
    """A request given to `ClientPool.send`: written on a pooled connection, or to be written on
    a new one; `response` waits for its head."""

    __slots__ = ("pool", "key", "head", "body", "listener", "connection", "reused", "error")

    def __init__(self, pool: ClientPool, listener: BodyListener | None) -> None:
        self.pool = pool
        self.listener = listener
        self.key: tuple[str, str, int] = ("", "", 0)
        self.head = b""
        self.body = b""
        self.connection: ClientConnection | None = None  # the connection it was written on
        self.reused = False
        self.error: Exception | None = None  # what send() could not do, raised by response()

    def write_on(self, connection: ClientConnection, *, reused: bool) -> None:
        self.connection, self.reused = connection, reused
        connection.listener = self.listener
        connection.write_request(self.head, self.body)

    async def response(self) -> ClientResponse:
        """The response head (see ClientPool.send). A reused connection that the server
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
                    continue  # the server closed (or reset) this idle connection as we sent: a fresh one
                raise
            except BaseException:
                connection.close()
                raise
            assert head is not None  # wait() returns once the head is in
            return ClientResponse(self.pool, connection, head)


class ClientPool:
    """Keep-alive connections to servers, any number per server (the caller bounds how many)."""

    def __init__(self, connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[ClientConnection]] = {}
        self._targets: dict[str, tuple[tuple[str, str, int], bytes]] = {}
        self._closed = False

    def _target(self, url: str) -> tuple[tuple[str, str, int], bytes]:
        """(scheme, host, port) and the request-line path of an absolute URL (parsed once per URL)."""
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ClientError(f"cannot send to {url!r}: not an http(s) URL")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host_header = parts.netloc.rpartition("@")[2]
            target = ((parts.scheme, parts.hostname, port), f" {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1"))
            if len(self._targets) < 4096:
                self._targets[url] = target
        return target

    def send(self, method: str, url: str, headers: bytes, body: bytes, listener: BodyListener | None = None) -> SentRequest:
        """Write one request now when an idle pooled connection to its server is at hand (else at
        `SentRequest.response`), so that it leaves before the caller's bookkeeping. Raises nothing:
        a failure is raised by `response`, where the caller handles every failure of the attempt.

        `headers` are header lines ready to send (`Name: value\r\n` each, http1.headers.header_lines),
        so that the caller builds its fixed ones once; Host and Content-Length are added here. A
        `listener` hears the body from its first byte (else the body waits for `read`)."""
        sent = SentRequest(self, listener)
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

    async def request(self, method: str, url: str, headers: bytes, body: bytes) -> ClientResponse:
        """Send one request and wait for the response head (not the body)."""
        return await self.send(method, url, headers, body).response()

    def _take_idle(self, key: tuple[str, str, int]) -> ClientConnection | None:
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

    async def _connect(self, key: tuple[str, str, int]) -> ClientConnection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            context = self._ssl_context
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: ClientConnection(key), host, port, ssl=context), self.connect_timeout_s
            )
        except asyncio.TimeoutError:
            raise ClientError(f"connect to {host}:{port} timed out after {self.connect_timeout_s:g} s") from None
        return protocol

    def _give_back(self, connection: ClientConnection) -> None:
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
