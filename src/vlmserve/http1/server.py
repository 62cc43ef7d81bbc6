"""The gateway's HTTP/1.1 server: one asyncio protocol on llhttp, serving every route.

A connection (`HttpConnection`) feeds what it receives to llhttp's request parser; each complete
request (head and body, within the limits) is queued, and one task per connection serves the
queue in order: `handler(request)` returns a whole `Response` (written here) or a `Stream` the
handler has already written. The task lives as long as the connection, waiting between
requests: a task per request would cost its creation and teardown every time.

The rules kept (settings in `ServerLimits`; defaults close to nginx's):
- A head within `max_head_bytes` (else 431), complete within `header_timeout_s` of the
  connection opening or of the first byte of a later request (else 408). The size is that of the
  request line and fields, counted the same however TCP splits the bytes; a head still incomplete
  past the limit is refused at once, so a header that never ends costs no more than the limit.
- A body within `max_body_bytes`: a larger Content-Length is refused before the body is read
  (413), a chunked body as soon as it passes the limit; its chunk framing, extensions and
  trailers within `max_head_bytes` plus the payload so far (else 400). A body may take its time,
  but no more than `header_timeout_s` between two reads (else 408). `Expect: 100-continue` is
  answered `100 Continue` when the announced body fits (413 otherwise); any other expectation is
  417; in an HTTP/1.0 request Expect is ignored (RFC 9110 10.1.1).
- Anything llhttp refuses (CL with TE, a duplicate Content-Length, obs-fold, bare LF, NUL, a chunk
  size that is not plain hex, ...), a repeated singleton header or a Transfer-Encoding other than
  `chunked` (headers.py), an HTTP/1.1 request without Host, Transfer-Encoding in an HTTP/1.0
  request, an Upgrade or a CONNECT, an HTTP version other than 1.0/1.1 (505): one INFO log line,
  the error answer, and the connection closed. Nothing received after a refused request is parsed.
- Keep-alive: HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
  After `Connection: close` nothing else the client sends is read (RFC 9112 9.6). Pipelined
  requests wait for the answer before them; reading pauses while more than `MAX_QUEUED_BYTES`
  or `MAX_QUEUED_REQUESTS` of them wait (one read may queue more), and no answer is made while
  the client leaves the ones before it unread. An idle kept-alive connection closes after
  `keepalive_timeout_s`.
- A client that closes the connection cancels its request in progress (the replica sees the
  disconnect and aborts). A client that only shuts its sending side: a GET or HEAD received whole
  is still answered; anything else is taken to have left (engine work is not done for nobody;
  nginx's `proxy_ignore_client_abort off`).
- A cap on connections: over `max_connections` a new connection is answered 503 with
  `Retry-After: 1` without being read, and closed; the connections already open are untouched.
- After a 408, a refusal or a 503 over the cap the connection is half-closed and what the client
  still sends is read and discarded for `CLOSE_LINGER_S`: closing on unread bytes makes the
  kernel send a reset, which can reach the client before the answer.

Error answers are rendered by the `render_error` the owner passes in (the gateway's OpenAI
format), so that every error a client sees has one shape.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httptools

from vlmserve.http1.headers import FramingError, Headers, check_framing
from vlmserve.http1.messages import Answer, Request, Response, Stream, StreamListener

log = logging.getLogger("vlmserve.http1")

Handler = Callable[[Request], Awaitable[Answer]]
ErrorRenderer = Callable[[int, str, str], Response]
"""(status, one-line message, machine-readable code) -> the answer a client gets."""

MAX_QUEUED_BYTES = 65536  # body bytes of pipelined requests held while one is served; reading pauses above
MAX_QUEUED_REQUESTS = 32  # pipelined requests held while one is served; reading pauses above
CLOSE_LINGER_S = 1.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LOGGED_CHARS = 160


@dataclass
class ServerLimits:
    max_body_bytes: int
    header_timeout_s: float = 15.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 0  # 0: no cap
    max_head_bytes: int = 16384
    body_hint: str = ""  # appended to a 413's message: how the client or the operator gets past it


@dataclass
class ClientStats:
    """Counts read by /metrics at scrape time. A connection counts from its protocol's creation
    (at accept, before a TLS handshake ends), so the cap holds exactly under a burst of accepts."""

    live: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    refused: int = 0
    header_timeouts: int = 0
    malformed: int = 0

    @property
    def open(self) -> int:
        return len(self.live)


class Refused(Exception):
    """A request the server answers itself, then closes the connection."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class HttpServer:
    """What every connection shares: the handler, the limits, the deadline ticker."""

    def __init__(
        self, handler: Handler, limits: ServerLimits, render_error: ErrorRenderer, stats: ClientStats | None = None
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.render_error = render_error
        self.stats = stats if stats is not None else ClientStats()
        self.loop = asyncio.get_running_loop()
        self.connections: set[HttpConnection] = set()
        self.closing = False
        # One timer for every connection's deadline (header, keep-alive, linger) instead of a timer
        # per request: a deadline is a float written per request, checked a few times a second.
        self.tick_s = max(0.01, min(1.0, limits.header_timeout_s / 8, limits.keepalive_timeout_s / 8))
        self._ticker: asyncio.TimerHandle | None = self.loop.call_later(self.tick_s, self._tick)
        too_many = render_error(503, "the gateway has too many open connections: retry shortly", "too_many_connections")
        too_many.headers["Retry-After"] = "1"
        self._too_many = too_many.to_bytes(close=True)

    def __call__(self) -> asyncio.Protocol:
        """The listening socket's protocol factory."""
        limits = self.limits
        if limits.max_connections and self.stats.open >= limits.max_connections:
            self.stats.refused += 1
            return _Refusal(self._too_many)
        connection = HttpConnection(self)
        self.stats.live.add(connection)
        return connection

    def _tick(self) -> None:
        now = self.loop.time()
        for connection in list(self.connections):
            if connection.deadline and now >= connection.deadline:
                connection.on_deadline()
        self._ticker = None if self.closing and not self.connections else self.loop.call_later(self.tick_s, self._tick)

    def close_idle(self) -> None:
        """Stop: idle connections close now, busy ones after their answer."""
        self.closing = True
        for connection in list(self.connections):
            if not connection.busy:
                connection.close()

    def close_all(self) -> None:
        """After the drain: whatever is still open closes."""
        for connection in list(self.connections):
            connection.close()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    @property
    def busy_connections(self) -> int:
        return sum(connection.busy for connection in self.connections)


class HttpConnection(asyncio.Protocol):
    """One client connection: llhttp's callbacks build requests, `_serve` answers them in turn."""

    __slots__ = (
        "server",
        "transport",
        "parser",
        "queue",
        "queued_bytes",
        "task",
        "ready",
        "serving",
        "deadline",
        "awaiting_head",
        "reading_paused",
        "writing_paused",
        "drain_waiter",
        "listener",
        "lingering",
        "stop_reading",
        "half_closed",
        "_method",
        "_url",
        "_headers",
        "_head_size",
        "_head_fed",
        "_completed_in_read",
        "_in_head",
        "_in_body",
        "_body",
        "_body_size",
        "_body_overhead",
        "_continue_due",
        "_refused",
        "__weakref__",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()
        self.queued_bytes = 0
        self.task: asyncio.Task | None = None
        self.ready: asyncio.Future[None] | None = None  # the idle serving task waits on it
        self.serving: Request | None = None
        self.deadline = 0.0  # loop time of the head, keep-alive or linger deadline; 0: none
        self.awaiting_head = False  # the deadline is a head's (408) rather than an idle connection's
        self.reading_paused = False
        self.writing_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.listener: StreamListener | None = None  # the relay of a streamed answer in progress
        self.lingering = False
        self.stop_reading = False  # after Connection: close or a refusal: nothing more is parsed
        self.half_closed = False  # the client shut its sending side
        self._method = ""
        self._url = bytearray()
        self._headers = Headers()
        self._head_size = 0
        self._head_fed = 0
        self._completed_in_read = False  # a request ended earlier in the read being parsed
        self._in_head = False
        self._in_body = False  # between a head and the end of its body
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_overhead = 0  # bytes of a body's reads that were not payload (chunk framing, trailers)
        self._continue_due = False  # a 100 Continue waits for the answers before it (_serve)
        self._refused: Refused | None = None

    @property
    def busy(self) -> bool:
        return self.serving is not None or bool(self.queue)

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self.lingering or self.stop_reading:
            return
        if not self.awaiting_head and not self.busy and not self._in_head and not self._in_body:
            self._await_head()  # the first bytes of a request on a kept-alive connection
        self._completed_in_read = False
        in_body, body_before = self._in_body, self._body_size
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            # HttpParserUpgrade is not an HttpParserError: uncaught, it was a traceback and a dropped
            # connection (a CONNECT did that before on_headers_complete refused it)
            refused, self._refused = self._refused, None
            if refused is None and self.stop_reading:
                return  # what followed a last request (Connection: close): never parsed
            self._refuse(refused or Refused(400, f"malformed HTTP request ({err})", "malformed_request"))
            return
        if self._in_head:
            # Bytes of a head still incomplete: counted over whole reads (a read in which the head
            # began after another request ended counts from the next: where it began is unknown),
            # so a header that never ends is refused once past the limit and never buffered beyond
            # it by more than a read.
            self._head_fed = 0 if self._head_fed < 0 else self._head_fed + len(data)
            if self._head_fed > self.server.limits.max_head_bytes:
                self._refuse(self._head_too_large())
                return
        elif self._in_body:
            # A body still incomplete. Its reads may be as far apart as a head's (header_timeout_s,
            # else 408): before, the head's deadline ran on into the body (_await_head above), so a
            # steady upload longer than header_timeout_s was cut with a 408. And what its reads hold
            # beyond payload (chunk framing and extensions, trailers, which httptools buffers whole
            # before on_header) is bounded by a head's size plus the payload so far: a trailer that
            # never ended was buffered without limit (Go's net/http bounds chunk overhead alike).
            limits = self.server.limits
            self.deadline = self.server.loop.time() + limits.header_timeout_s
            if in_body and not self._completed_in_read:  # the whole read was this body's
                self._body_overhead += len(data) - (self._body_size - body_before)
                if self._body_overhead > limits.max_head_bytes + self._body_size:
                    self._refuse(
                        Refused(
                            400,
                            "chunked body with more bytes of chunk framing, extensions or trailers than of data",
                            "malformed_request",
                        )
                    )
                    return
        if (
            (self.queued_bytes > MAX_QUEUED_BYTES or len(self.queue) > MAX_QUEUED_REQUESTS)
            and not self.reading_paused
            and self.transport is not None
        ):
            self.transport.pause_reading()
            self.reading_paused = True

    def eof_received(self) -> bool:
        """The client shut its sending side (module docstring): keep the transport open only to
        answer a GET or HEAD already received whole."""
        self.half_closed = True
        self.stop_reading = True
        request = self.serving or (self.queue[0] if self.queue else None)
        if request is not None and request.method in ("GET", "HEAD") and not self.lingering:
            self.queue = deque([request]) if self.serving is None else deque()
            return True
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.deadline = 0.0
        self.server.connections.discard(self)
        self.server.stats.live.discard(self)
        self.transport = None
        listener = self.listener
        if listener is not None:
            listener.client_lost()  # before the transport is gone under it: no more writes
        if self.task is not None:
            self.task.cancel()  # a request in progress: the replica's connection closes and it aborts
        self._wake_drain()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.listener is not None:
            self.listener.pause()  # stop reading the replica until this socket drains

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_drain()

    async def drain(self) -> None:
        """Until the client's socket takes bytes again (or is gone)."""
        if not self.writing_paused or self.transport is None:
            return
        self.drain_waiter = self.server.loop.create_future()
        try:
            await self.drain_waiter
        finally:
            self.drain_waiter = None

    def _wake_drain(self) -> None:
        waiter = self.drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- llhttp's callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.stop_reading:
            raise _StopParsing  # after a last request: nothing more is parsed
        self._in_head = True
        # Began at this read's first byte unless a request ended earlier in it: then the whole read
        # is this head's and counts (data_received). Counting from the next read only made a head
        # that never ends, sent in one write, wait for the header timeout (408) where the same
        # bytes in two writes were refused at once (431).
        self._head_fed = -1 if self._completed_in_read else 0
        self._url = bytearray()
        self._headers = Headers()
        self._head_size = 0
        self._body = []
        self._body_size = 0
        self._body_overhead = 0
        if not self.awaiting_head and not self.busy:
            self._await_head()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > self.server.limits.max_head_bytes:
            self._fail(self._head_too_large())

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer of a chunked body: not used
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.server.limits.max_head_bytes:
            self._fail(self._head_too_large())
        try:
            self._headers.add(name, value)
        except FramingError as err:
            too_many = "header fields" in str(err)  # 431 and its code, as for a head over the byte limit
            self._fail(
                Refused(431, str(err), "request_header_fields_too_large")
                if too_many
                else Refused(400, str(err), "malformed_request")
            )

    def on_headers_complete(self) -> None:
        parser = self.parser
        limits = self.server.limits
        self._in_head = False
        self._method = parser.get_method().decode("ascii", "replace")
        self._head_size += len(self._method) + 12
        if self._head_size > limits.max_head_bytes:
            self._fail(self._head_too_large())
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            self._fail(Refused(505, f"HTTP/{version} is not supported: send HTTP/1.1", "http_version_not_supported"))
        headers = self._headers
        if version == "1.1" and "host" not in headers:  # RFC 9112 3.2 requires the 400 (nginx and h11 send it)
            self._fail(Refused(400, "an HTTP/1.1 request must carry a Host header", "malformed_request"))
        if "upgrade" in headers or self._method == "CONNECT":  # llhttp ends a CONNECT's parse as an upgrade
            self._fail(Refused(400, "protocol upgrades (Upgrade, CONNECT) are not supported", "upgrade_not_supported"))
        try:
            chunked = check_framing(headers)
        except FramingError as err:
            self._fail(Refused(400, str(err), "malformed_request"))
        if chunked and version == "1.0":
            # RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (an HTTP/1.0
            # hop before this one would not have read it as chunked); llhttp takes it, and with
            # Connection: keep-alive, reads on after it. Refused, as nginx does.
            self._fail(
                Refused(400, "Transfer-Encoding in an HTTP/1.0 request: send HTTP/1.1, or a Content-Length", "malformed_request")
            )
        length = dict.get(headers, "content-length")
        if length is not None and int(length) > limits.max_body_bytes:
            self._fail(self._body_too_large(int(length)))
        expect = dict.get(headers, "expect")
        if expect is not None and version == "1.1":  # RFC 9110 10.1.1: ignored in an HTTP/1.0 request
            if expect.lower() != "100-continue":
                self._fail(Refused(417, f"Expect {expect[:40]!r} is not supported", "expectation_failed"))
            if self.transport is not None and (length is not None or chunked):
                if self.busy:  # a 100 is this request's, so it follows the answers before (RFC 9110 15.2);
                    self._continue_due = True  # written earlier, a client took it for theirs
                else:
                    self.transport.write(_CONTINUE)
        self.deadline = 0.0  # the head is complete: the body's reads have their own deadline (data_received)
        self.awaiting_head = False
        self._in_body = True

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.server.limits.max_body_bytes:
            self._fail(self._body_too_large(None))
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        keep_alive = parser.should_keep_alive()
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._in_body = self._continue_due = False  # a body sent without waiting for its 100 needs none
        self._completed_in_read = True
        request = Request(
            self._method, self._url.decode("latin-1"), "", self._headers, body, parser.get_http_version() == "1.0", self
        )
        if not keep_alive:
            self.stop_reading = True  # nothing after this request is processed
            # llhttp goes on parsing the rest of this read: its next callbacks see stop_reading
        self.queued_bytes += len(body)
        self.queue.append(request)
        self._schedule()

    # ---- serving -----------------------------------------------------------------------------

    def _schedule(self) -> None:
        ready = self.ready
        if ready is not None:
            self.ready = None
            ready.set_result(None)
        elif self.task is None:
            self.task = self.server.loop.create_task(self._serve())

    async def _serve(self) -> None:
        """This connection's requests, in turn, until it closes."""
        try:
            while True:
                if not self.queue:
                    if self.stop_reading or self.transport is None:
                        self.close()
                        return
                    self.ready = self.server.loop.create_future()
                    await self.ready
                    continue
                if not await self._serve_next():
                    return
        except asyncio.CancelledError:
            self.close()  # the client went away (or the gateway stops): nothing more on this connection
            return
        finally:
            self.task = self.ready = None
            self.serving = None

    async def _serve_next(self) -> bool:
        """The first queued request, answered; False once the connection is done with."""
        server = self.server
        request = self.queue.popleft()
        self.queued_bytes -= len(request.body)
        # Reading resumes as soon as what waits is back under the bounds, before the answer:
        # the bound is on pipelined requests, and a client that leaves while its own request
        # is served must be seen leaving (its request is then cancelled), which a paused
        # socket hides (a body over MAX_QUEUED_BYTES paused it).
        self._resume_if_room()
        if isinstance(request, _RefusalRequest):
            if self.transport is not None:
                self.transport.write(request.answer.to_bytes(close=True))
            self._linger()
            return False
        answer = await self._answer(request)
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        last = (self.stop_reading and not self.queue) or server.closing
        if isinstance(answer, Stream):
            if not (answer.started and answer.ended) or not answer.chunked:
                self.close()  # a cut stream, or an HTTP/1.0 client's body ended by the close
                return False
        elif isinstance(answer, Response):
            transport.write(self._render(answer, request, close=last))
        else:  # a bug in the handler: this connection closes, the server goes on
            log.error("request %s %s: the handler answered %r", request.method, request.target[:80], type(answer).__name__)
            self.close()
            return False
        if last:
            self._linger()
            return False
        if self.writing_paused and not await self._wait_for_reader():
            return False
        self._resume_if_room()
        if self._continue_due and not self.queue:
            self._continue_due = False
            transport.write(_CONTINUE)  # the next request's, held while this answer was made
        if self._in_head:
            self._await_head()  # a pipelined head begun while this answer was served
        elif self._in_body:  # a pipelined body under way: its reads' deadline (data_received)
            self.deadline = server.loop.time() + server.limits.header_timeout_s
        elif not self.queue:
            self.deadline = server.loop.time() + server.limits.keepalive_timeout_s
            self.awaiting_head = False
        return True

    async def _answer(self, request: Request) -> Answer:
        """The handler's answer; a handler that raises (a bug) costs this request a 500."""
        self.serving = request
        try:
            return await self.server.handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:  # the handler answers its own errors: this is a bug, and costs this request
            log.exception("request %s %s failed", request.method, request.target[:80])
            return self.server.render_error(500, "internal server error; see the gateway log", "internal_error")
        finally:
            self.serving = None

    async def _wait_for_reader(self) -> bool:
        """A client that pipelines and does not read its answers: none more is made until it does
        (reading stays paused once the queue is full). Without this, its answers piled up in the
        transport's buffer without limit (GET /metrics: 170 times the bytes of the requests). One
        that reads nothing for keepalive_timeout_s is dropped, as by nginx's send_timeout: else it
        held its connection for ever. False: the connection is gone."""
        try:
            await asyncio.wait_for(self.drain(), self.server.limits.keepalive_timeout_s)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()  # close() would wait for the unread answers to leave
            return False
        return self.transport is not None

    def _resume_if_room(self) -> None:
        # the count too, not only the bytes: else every answer resumed reading, and each read queued
        # thousands more bodiless requests
        if (
            self.reading_paused
            and self.transport is not None
            and self.queued_bytes <= MAX_QUEUED_BYTES
            and len(self.queue) <= MAX_QUEUED_REQUESTS
            and not self.writing_paused
        ):
            self.reading_paused = False
            self.transport.resume_reading()

    @staticmethod
    def _render(answer: Response, request: Request, *, close: bool) -> bytes:
        if request.http10 and not close:
            answer.headers["Connection"] = "keep-alive"
        return answer.to_bytes(close=close, head_only=request.method == "HEAD")

    # ---- refusals ----------------------------------------------------------------------------

    def _head_too_large(self) -> Refused:
        limit = self.server.limits.max_head_bytes
        return Refused(431, f"request head over the {limit}-byte limit", "request_header_fields_too_large")

    def _body_too_large(self, length: int | None) -> Refused:
        limits = self.server.limits
        what = f"request body is {length} bytes" if length is not None else "request body is"
        hint = f": {limits.body_hint}" if limits.body_hint else ""
        return Refused(413, f"{what} over the {limits.max_body_bytes}-byte limit{hint}", "body_too_large")

    def _fail(self, refused: Refused) -> None:
        """From inside a parser callback: stop llhttp (the exception aborts feed_data) with this answer."""
        self._refused = refused
        raise refused

    def _refuse(self, refused: Refused) -> None:
        """Answer a request the server will not serve, after any answers before it, then close."""
        stats = self.server.stats
        stats.malformed += 1
        what = ascii(" ".join(refused.message.split()))[1:-1][:_LOGGED_CHARS]
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.info("HTTP request from %s refused with %d: %s", peer, refused.status, what)
        self.stop_reading = True
        self._in_head = self._in_body = False
        answer = self.server.render_error(refused.status, refused.message, refused.code)
        if self.busy:  # an answer in progress goes first; this one is queued behind it
            self.queue.append(_RefusalRequest(answer, self))
            self._schedule()
            return
        if self.transport is not None:
            self.transport.write(answer.to_bytes(close=True))
            self._linger()

    # ---- deadlines and closing ---------------------------------------------------------------

    def _await_head(self) -> None:
        self.awaiting_head = True
        self.deadline = self.server.loop.time() + self.server.limits.header_timeout_s

    def on_deadline(self) -> None:
        self.deadline = 0.0
        if self.lingering:
            self.close()
            return
        if self.transport is None or self.busy:
            return
        if self.awaiting_head or self._in_body:
            self.server.stats.header_timeouts += 1
            self.stop_reading = True
            what = "body" if self._in_body else "headers"
            answer = self.server.render_error(408, f"request {what} not received in time", "request_timeout")
            self.transport.write(answer.to_bytes(close=True))
            self._linger()
            return
        self.close()  # an idle kept-alive connection

    def _linger(self) -> None:
        """Half-close and discard what still comes for CLOSE_LINGER_S (module docstring)."""
        transport = self.transport
        if transport is None:
            return
        self.lingering = True
        self.awaiting_head = False
        if self.half_closed or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        self.deadline = self.server.loop.time() + CLOSE_LINGER_S

    def close(self) -> None:
        self.deadline = 0.0
        if self.transport is not None:
            self.transport.close()


class _StopParsing(Exception):
    """Raised from a parser callback to stop llhttp where nothing more is to be read."""


class _RefusalRequest(Request):
    """A refusal queued behind answers in progress: `_serve` writes it and closes."""

    __slots__ = ("answer",)

    def __init__(self, answer: Response, connection: HttpConnection) -> None:
        super().__init__("REFUSED", "", "", Headers(), b"", False, connection)
        self.answer = answer


class _Refusal(asyncio.Protocol):
    """A connection over the cap: the 503, then closed once the client is done or after a linger."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.answer)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(CLOSE_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # discarded: closing with unread bytes would reset the connection and lose the 503

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
