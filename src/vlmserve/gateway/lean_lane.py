"""The lean lane: engine-work requests served straight off the client socket, without aiohttp's server.

Why: measured with benchmarks/gateway_overhead.py, aiohttp's server machinery (its parser
callbacks, request objects, application router, middleware and response preparation) was
about a quarter of the gateway's CPU per streamed request, and the gateway's CPU per chunk
was above the Rust router's. The lean lane serves the one request shape that carries a
deployment's traffic — a plain HTTP/1.1 POST of JSON to a generation or pooling path — with a
few dozen lines of work per request, and leaves everything else to aiohttp.

Every connection starts here (`LeanConnection`). Per request:
- The head is checked against a strict subset of HTTP/1.1 (lean_http.py) as its bytes arrive.
  A request outside it — GET /health, a bad path, a chunked upload, `Expect`, a duplicate
  header, garbage — hands the connection to aiohttp (`GuardedRequestHandler`) with every byte
  received so far, unread: aiohttp and the trust boundary (routes.py) then answer it exactly as
  they would have, and the connection stays with aiohttp.
- A request inside the subset runs the gateway's own handler (`Gateway.handle_engine_work`: the
  same admission, media policy, routing, metrics and audit as on aiohttp's path). Its answer is
  written as bytes; a streamed one leaves through `LeanStream`, the replica's frames verbatim.
- The listening socket's rules hold here too (client_limits.py): headers within
  `header_timeout_s` (else 408 and close), idle kept-alive connections closed after
  `keepalive_timeout_s`, the connection counted against `max_connections`, a client that goes
  away cancels its request (the replica sees the disconnect and aborts), and a pipelined
  request waits for the one before it.

A connection's requests are served one after another by one task (`LeanConnection._serve`),
started with its first request and waiting on a future between requests: a task per request
cost its creation, its registration among the loop's tasks (a weak reference and its removal
callback) and its teardown every time. The stall watchdog's cancellation reaches that task as
before; the forwarder takes it back (`Task.uncancel`) when it turns it into an error event.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from vlmserve.gateway.lean_http import (
    CLOSE_LINGER_S,
    MAX_HEAD_BYTES,
    REQUEST_TIMEOUT,
    LeanHead,
    LeanRequest,
    first_line_fits,
    parse_head,
    response_head,
    serialize_response,
)

if TYPE_CHECKING:
    from vlmserve.gateway.relay import StreamRelay

log = logging.getLogger("vlmserve.gateway")

MAX_PENDING_BYTES = 65536  # bytes of a next (pipelined) request held while one is served; reading pauses above

Handler = Callable[[LeanRequest], Awaitable[Any]]


class LeanStream:
    """A streamed answer on the lean lane, in the shape the relay and forwarder use.

    The head leaves with the first frames (`start`, one write; an armed relay renders it before
    the first frames come, `render_head`); the replica's chunked frames
    pass verbatim (the relay adds the terminating chunk); `write_eof` only marks the body ended."""

    __slots__ = ("connection", "status", "headers", "head", "started", "ended")

    def __init__(self, request: LeanRequest, status: int, headers: dict[str, str]) -> None:
        self.connection: LeanConnection = request.connection
        self.status = status
        self.headers = headers
        self.head = b""  # rendered ahead of `start` by an armed relay (relay.py), while the engine computes
        self.started = False
        self.ended = False

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.connection.transport

    def render_head(self) -> None:
        self.head = response_head(self.status, self.headers.items(), chunked=True)

    def start(self, first: bytes) -> None:
        if not self.head:
            self.render_head()
        self.started = True
        transport = self.connection.transport
        if transport is not None and not transport.is_closing():
            transport.write(self.head + first)

    async def write(self, data: bytes) -> None:
        transport = self.connection.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        transport.write(data)

    async def write_eof(self) -> None:
        self.ended = True

    async def drain(self) -> None:
        await self.connection.drain()


Answer = web.StreamResponse | LeanStream
"""What the engine-work handler returns: aiohttp's response, or a lean stream already written."""


class LeanLane:
    """What every lean connection shares: the handler, the limits, and how to reach aiohttp."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, header_timeout_s: float,
                 keepalive_timeout_s: float, stats: Any, make_aiohttp_handler: Callable[[], Any]) -> None:
        self.loop = asyncio.get_running_loop()  # held: asking for it per request costs a getpid() each time
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.header_timeout_s = header_timeout_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.stats = stats  # client_limits.ClientStats
        self.make_aiohttp_handler = make_aiohttp_handler
        self.connections: set[LeanConnection] = set()  # each leaves at its connection_lost or hand-over
        self.closing = False
        # One timer for every connection's deadline (header, keep-alive) instead of a timer per
        # request: a deadline is then a float written per request, checked a few times a second.
        self.tick_s = max(0.01, min(1.0, header_timeout_s / 8, keepalive_timeout_s / 8))
        self._ticker: asyncio.TimerHandle | None = None

    def add(self, connection: LeanConnection) -> None:
        self.connections.add(connection)
        if self._ticker is None and not self.closing:
            self._ticker = self.loop.call_later(self.tick_s, self._tick)

    def _tick(self) -> None:
        loop = self.loop
        now = loop.time()
        for connection in list(self.connections):
            if connection.deadline and now >= connection.deadline:
                connection.on_deadline()
        self._ticker = None if self.closing else loop.call_later(self.tick_s, self._tick)

    def close_idle(self) -> None:
        """The gateway stops: idle connections close now, busy ones after their answer."""
        self.closing = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        for connection in list(self.connections):
            if not connection.serving and connection.transport is not None:
                connection.transport.close()


class LeanConnection(asyncio.Protocol):
    """One client connection, until (if ever) it is handed to aiohttp."""

    __slots__ = ("lane", "transport", "buffer", "head", "serving", "pending", "server", "ready", "deadline",
                 "header_deadline", "handed", "reading_paused", "writing_paused", "drain_waiter", "relay", "lingering",
                 "close_after", "__weakref__")

    def __init__(self, lane: LeanLane) -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: tuple[LeanHead, int] | None = None  # a parsed head and where its body starts
        self.serving = False  # a request is with the handler (from its dispatch to its answer written)
        self.pending: LeanRequest | None = None  # dispatched, not yet taken by the server task
        self.server: asyncio.Task | None = None  # serves this connection's requests in turn (_serve)
        self.ready: asyncio.Future[None] | None = None  # the idle server task waits on it for the next request
        self.deadline = 0.0  # loop time when the head (header_deadline) or the next request (keep-alive) is due; 0: none
        self.header_deadline: float | None = None  # while a request's head is awaited
        self.handed = False
        self.reading_paused = False
        self.writing_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.relay: StreamRelay | None = None  # the stream being relayed to this client, told of loss and back-pressure
        self.lingering = False  # answered 408: what the client still sends is discarded until the close
        self.close_after = False  # the request being served said Connection: close: nothing after it is read

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lane.add(self)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self.lingering or self.close_after:
            return
        if not self.serving and self.head is None and not self.buffer and self.transport is not None:
            # The common case: a whole request in one read, served without copying it into the buffer.
            end = data.find(b"\r\n\r\n")
            head = parse_head(data[:end], self.lane.max_body_bytes) if end > 0 else None
            if head is not None and len(data) == end + 4 + head.content_length:
                self._dispatch(head, data[end + 4:])
                return
        self.buffer += data
        if self.serving:  # a pipelined request: it waits for the answer in progress
            if len(self.buffer) > MAX_PENDING_BYTES and not self.reading_paused and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True
            return
        if self.header_deadline is None and self.head is None:
            self._await_head()  # the first bytes of a request on a kept-alive connection
        self._advance()

    def eof_received(self) -> bool:
        """The client shut its sending side: it is taken to have left, and a request in progress is
        cancelled (the replica aborts it at once). Everything on this lane is engine work (a POST):
        answering a client that may be gone would let anyone queue expensive generations and hang up,
        holding no connection while the engines work. nginx does the same by default
        (`proxy_ignore_client_abort off`). A half-closed GET (/health, /v1/models) on the other lane
        is answered (client_limits.py)."""
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.deadline = 0.0
        self.lane.connections.discard(self)
        self.lane.stats.live.discard(self)
        self.transport = None
        if self.relay is not None:
            self.relay.client_lost()  # before the transport is closed under it: no more writes
        if self.server is not None:
            self.server.cancel()  # a request in progress: the handler's forwarder closes the replica's connection
        self._wake_drain()

    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.relay is not None:
            self.relay.pause()  # stop reading the replica until this socket drains

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_drain()

    async def drain(self) -> None:
        """Until the client's socket takes bytes again (or is gone)."""
        if not self.writing_paused or self.transport is None:
            return
        self.drain_waiter = self.lane.loop.create_future()
        try:
            await self.drain_waiter
        finally:
            self.drain_waiter = None

    # ---- requests ----------------------------------------------------------------------------

    def _advance(self) -> None:
        """Serve the buffered request when it is whole, wait for more bytes, or hand over."""
        if self.transport is None or self.handed:
            return
        buffer = self.buffer
        if self.head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                line_end = buffer.find(b"\r\n")
                # a head longer than MAX_HEAD_BYTES cannot end inside these bytes: the same judgement
                # as parse_head's on a head that came whole, whatever the segmentation
                if len(buffer) >= MAX_HEAD_BYTES + 4 or (line_end >= 0 and not first_line_fits(bytes(buffer[:line_end]))):
                    self._hand_over()
                return
            head = parse_head(bytes(buffer[:end]), self.lane.max_body_bytes)
            if head is None:
                self._hand_over()
                return
            self.head = (head, end + 4)
            self.deadline = 0.0  # the head is complete (a body may take its time, as on aiohttp)
            self.header_deadline = None
        head, body_at = self.head
        body_end = body_at + head.content_length
        if len(buffer) < body_end:
            return
        body = bytes(buffer[body_at:body_end])
        if head.close:
            buffer.clear()  # pipelined after Connection: close: never processed (RFC 9112 9.6)
        else:
            del buffer[:body_end]
        self._dispatch(head, body)

    def _dispatch(self, head: LeanHead, body: bytes) -> None:
        """A whole request: no deadline runs while the handler serves it."""
        assert self.transport is not None
        self.head = None
        self.deadline = 0.0
        self.header_deadline = None
        self.serving = True
        self.close_after = head.close
        self.pending = LeanRequest(head.route, head.headers, body, self.transport, self)
        ready = self.ready
        if ready is not None:  # the server task waits for it
            self.ready = None
            ready.set_result(None)
        elif self.server is None:
            self.server = self.lane.loop.create_task(self._serve())
        # else: the server task itself dispatched it (a pipelined request) and takes it next

    async def _serve(self) -> None:
        """This connection's requests, in turn, until it closes or is handed over (module docstring)."""
        loop = self.lane.loop
        try:
            while not self.handed:
                request = self.pending
                if request is None:  # between requests: until the next is dispatched
                    self.ready = loop.create_future()
                    await self.ready
                    continue
                self.pending = None
                try:
                    response = await self.lane.handler(request)
                except Exception:  # the handler answers its own errors; this is a bug, and costs this connection only
                    log.exception("lean lane: request failed")
                    self._close()
                    return
                finally:
                    self.serving = False
                transport = self.transport
                if transport is None or transport.is_closing():
                    return
                if isinstance(response, LeanStream):
                    keep = response.started and response.ended
                else:
                    data, close = serialize_response(response)
                    transport.write(data)
                    keep = not close
                if not keep or self.lane.closing:
                    self._close()
                    return
                if self.close_after:  # Connection: close: half-close and discard what else comes
                    self._linger(b"")
                    return
                if self.reading_paused:
                    self.reading_paused = False
                    transport.resume_reading()
                request = response = None  # not kept alive (a body may be megabytes) while the connection idles
                if self.buffer:
                    self._await_head()
                    self._advance()  # a pipelined request whole in the buffer is dispatched here (`pending`)
                if not self.buffer:
                    self.deadline = loop.time() + self.lane.keepalive_timeout_s
        except asyncio.CancelledError:
            return  # the client went away
        finally:
            self.server = self.ready = None
            self.serving = False

    def _hand_over(self) -> None:
        """aiohttp takes the connection, and every byte received, from this request on."""
        transport = self.transport
        assert transport is not None
        self.deadline = 0.0
        remaining = None
        if self.header_deadline is not None:
            remaining = max(0.0, self.header_deadline - self.lane.loop.time())
        self.handed = True
        ready, self.ready = self.ready, None
        if ready is not None:
            ready.set_result(None)  # the idle server task sees the hand-over and ends
        self.lane.stats.live.discard(self)
        self.lane.connections.discard(self)
        handler = self.lane.make_aiohttp_handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if remaining is not None:
            handler.limit_header_time(remaining)
        if self.reading_paused:
            transport.resume_reading()
        data, self.buffer = bytes(self.buffer), bytearray()
        self.transport = None
        if data:
            handler.data_received(data)

    # ---- deadlines (checked by LeanLane._tick) -----------------------------------------------

    def _await_head(self) -> None:
        self.header_deadline = self.deadline = self.lane.loop.time() + self.lane.header_timeout_s

    def on_deadline(self) -> None:
        self.deadline = 0.0
        if self.lingering:  # the 408's linger is over
            self._close()
            return
        if self.transport is None or self.serving or self.head is not None:
            return
        if self.header_deadline is not None:  # a head not complete in time: 408 (a kept-alive idle one just closes)
            self.lane.stats.header_timeouts += 1
            self._linger(REQUEST_TIMEOUT)
            return
        self._close()

    def _linger(self, answer: bytes) -> None:
        """Send `answer`, half-close, and read on (discarding) for CLOSE_LINGER_S or until the client
        closes its side (eof_received), so that the answer is not reset away by bytes still coming."""
        transport = self.transport
        assert transport is not None
        if answer:
            transport.write(answer)
        self.lingering = True
        self.buffer = bytearray()
        self.header_deadline = None
        if transport.can_write_eof():
            transport.write_eof()
        self.deadline = self.lane.loop.time() + CLOSE_LINGER_S

    def _close(self) -> None:
        self.deadline = 0.0
        if self.transport is not None:
            self.transport.close()

    def _wake_drain(self) -> None:
        waiter = self.drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

