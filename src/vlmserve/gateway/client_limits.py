"""Slow, idle, malformed and too many clients: what the gateway's listening socket tolerates.

The rules kept (settings in `GatewayConfig`; defaults close to nginx's):
- Headers in time: a client must complete its request headers within `header_timeout_s` of the
  connection opening, or of the first byte of a later request on a kept-alive connection; if
  not, it is sent `408 Request Timeout`, half-closed, read (and discarded) for `CLOSE_LINGER_S` or
  until the client closes, then closed: a reset from closing on unread bytes could reach the client
  before the 408 (nginx: client_header_timeout, lingering_close). Over TLS the handshake gets the
  same time.
- Idle connections: a kept-alive connection with no request for `keepalive_timeout_s` is
  closed (aiohttp's own keep-alive timer; nginx: keepalive_timeout).
- A cap on connections: with `max_connections` client connections open, one more is answered
  `503` with `Retry-After: 1` and `Connection: close` without being read, then closed; the
  listening socket keeps accepting, so a flood costs each extra connection an accept and one
  write, and the connections already open are untouched. Connections still in their TLS
  handshake are not counted (the handshake timeout bounds them).
- Malformed HTTP (garbage, a bad request line, an invalid header) gets aiohttp's 400 and one
  INFO log line, never a traceback.
- File descriptors: `vlmserve gateway` raises its soft open-file limit to what the cap needs
  (two per client connection: the client's and an upstream one), within the hard limit, and
  warns in one line when it cannot.
- Cost: nothing on the response (streaming) path; two attribute checks per chunk of request
  bytes received.

aiohttp's server has no header timeout and no connection cap, so the listening socket's
protocol factory (`ClientGuard`) makes `GuardedRequestHandler`s (aiohttp's RequestHandler plus a
header timer) or, over the cap, `_Refusal`s. The handler reads three of aiohttp's private
attributes (`_waiter`: waiting for a request; `_messages`: parsed requests not yet handled;
`_request_in_progress`); tests/integration/gateway/test_client_limits.py pins the behaviour they give.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
import weakref
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from vlmserve.gateway.lean_http import CLOSE_LINGER_S, REQUEST_TIMEOUT
from vlmserve.gateway.lean_lane import Handler as LeanHandler
from vlmserve.gateway.lean_lane import LeanConnection, LeanLane

log = logging.getLogger("vlmserve.gateway")

_TOO_MANY_BODY = (b'{"error":{"message":"the gateway has too many open connections: retry shortly",'
                  b'"type":"ServiceUnavailableError","code":"too_many_connections"}}')
_TOO_MANY = (b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
             b"Content-Type: application/json\r\nContent-Length: " + str(len(_TOO_MANY_BODY)).encode()
             + b"\r\n\r\n" + _TOO_MANY_BODY)
_LOGGED_ERROR_CHARS = 160


@dataclass
class ClientStats:
    """Counts read by /metrics at scrape time.

    A connection counts from its accept (not its connection_made, which asyncio runs later and,
    over TLS, only after the handshake): under a burst of accepts the cap holds exactly. A
    connection whose TLS handshake fails is never made nor lost; it leaves the set when its
    handler is garbage."""

    live: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    refused: int = 0
    header_timeouts: int = 0

    @property
    def open(self) -> int:
        return len(self.live)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection handler plus a header timer and one-line logging of malformed requests."""

    __slots__ = ("_stats", "_header_timeout_s", "_header_handle", "_lingering", "_last_body", "__weakref__")

    def __init__(self, manager: web.Server, *, stats: ClientStats, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._stats = stats
        self._header_timeout_s = header_timeout_s
        self._header_handle: asyncio.TimerHandle | None = None
        self._lingering = False  # answered 408: what the client still sends is discarded until the close
        self._last_body: Any = None  # the body stream of the latest request whose head arrived whole

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None
        self._stats.live.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._header_handle is None and self._waiter is not None:
            self._arm_header_timer()  # first bytes of a new request on a kept-alive connection
        super().data_received(data)
        if self._messages:
            message, body = self._messages[-1]
            self._last_body = body if getattr(message, "method", None) in ("GET", "HEAD") else None
            if self._header_handle is not None:
                self._header_handle.cancel()  # headers complete
                self._header_handle = None

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's: True keeps the transport open
        """The client shut its sending side: a GET received whole (/health, /v1/models ...) still gets
        its answer, then the connection closes (aiohttp's own handler closes at once and the answer is
        lost). A POST is taken to have been abandoned, as before: engine work is not done for nobody.
        (The lean lane, which carries engine work, answers half-closed unary requests itself.)"""
        # a request is queued, or taken by aiohttp's handler task and not yet answered (the task
        # waits on `_waiter` only between requests); a body cut short by the EOF closes as before
        body = self._last_body
        answering = self._messages or self._request_in_progress or (body is not None and self._waiter is None)
        if answering and body is not None and body.is_eof() and not self._lingering:
            self.close()  # no request after this one; the transport closes when it is answered
            return True
        return False

    def _arm_header_timer(self) -> None:
        self._header_handle = self._loop.call_later(self._header_timeout_s, self._on_header_timeout)

    def limit_header_time(self, remaining_s: float) -> None:
        """A connection handed over by the lean lane mid-head: the head gets only the time left."""
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = self._loop.call_later(remaining_s, self._on_header_timeout)

    def _on_header_timeout(self) -> None:
        self._header_handle = None
        if self._messages or self._request_in_progress or self.transport is None:
            return
        self._stats.header_timeouts += 1
        transport = self.transport
        transport.write(REQUEST_TIMEOUT)
        # Half-close and read on for a moment (CLOSE_LINGER_S), so the 408 is not reset away; the
        # client's own close (eof_received) ends it sooner. force_close then flushes and closes.
        self._lingering = True
        if transport.can_write_eof():
            transport.write_eof()
        self._header_handle = self._loop.call_later(CLOSE_LINGER_S, self.force_close)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse: one log line and a plain 400 (aiohttp's own logs a traceback)."""
        if not isinstance(exc, HttpProcessingError) or status >= 500:
            return super().handle_error(request, status, exc, message)
        what = ascii(" ".join(str(exc.message or exc).split()))[1:-1][:_LOGGED_ERROR_CHARS]  # one line, printable
        log.info("malformed HTTP request from %s answered %d: %s", request.remote, status, what)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; the connection is closed instead")
        response = web.Response(status=status, text=f"{status} {what}\n", content_type="text/plain")
        response.force_close()
        return response


class _Refusal(asyncio.Protocol):
    """A connection over the cap: 503, then closed once the client is done or after a short linger."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_TOO_MANY)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(CLOSE_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # discarded: closing with unread bytes would reset the connection and lose the 503

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class ClientGuard:
    """The listening socket's protocol factory: a lean-lane connection (lean_lane.py) or a guarded
    aiohttp handler, or a refusal over the cap."""

    def __init__(self, server: web.Server, stats: ClientStats, *, header_timeout_s: float, max_connections: int,
                 lean_handler: LeanHandler | None = None, max_body_bytes: int = 0) -> None:
        self.server = server
        self.stats = stats
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self._loop = asyncio.get_running_loop()
        self._handler_kwargs = server._kwargs  # what the AppRunner was given (keepalive_timeout, access_log ...)
        self.lane = LeanLane(lean_handler, max_body_bytes=max_body_bytes, header_timeout_s=header_timeout_s,
                             keepalive_timeout_s=self._handler_kwargs.get("keepalive_timeout", 75.0), stats=stats,
                             make_aiohttp_handler=self.aiohttp_handler) if lean_handler is not None else None

    def __call__(self) -> asyncio.Protocol:
        if self.max_connections and self.stats.open >= self.max_connections:
            self.stats.refused += 1
            return _Refusal()
        if self.lane is not None:
            connection = LeanConnection(self.lane)
            self.stats.live.add(connection)
            return connection
        return self.aiohttp_handler()

    def aiohttp_handler(self) -> GuardedRequestHandler:
        handler = GuardedRequestHandler(self.server, loop=self._loop, stats=self.stats,
                                        header_timeout_s=self.header_timeout_s, **self._handler_kwargs)
        self.stats.live.add(handler)
        return handler


class GuardedSite(web.TCPSite):
    """aiohttp's TCPSite, listening through a `ClientGuard` (and a TLS handshake timeout)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, stats: ClientStats, *,
                 header_timeout_s: float, max_connections: int, ssl_context: ssl.SSLContext | None = None,
                 backlog: int = 128, reuse_port: bool = False, lean_handler: LeanHandler | None = None,
                 max_body_bytes: int = 0) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=backlog, reuse_port=reuse_port)
        self._stats = stats
        self._header_timeout_s = header_timeout_s
        self._max_connections = max_connections
        self._lean_handler = lean_handler
        self._max_body_bytes = max_body_bytes
        self._guard: ClientGuard | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner (TCPSite.start would listen unguarded)
        server = self._runner.server
        assert server is not None
        guard = ClientGuard(server, self._stats, header_timeout_s=self._header_timeout_s,
                            max_connections=self._max_connections, lean_handler=self._lean_handler,
                            max_body_bytes=self._max_body_bytes)
        self._guard = guard
        self._server = await asyncio.get_running_loop().create_server(
            guard, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._header_timeout_s if self._ssl_context is not None else None,
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await super().stop()
        if self._guard is not None and self._guard.lane is not None:
            self._guard.lane.close_idle()  # aiohttp's shutdown closes its own connections, not the lean lane's


def ensure_file_descriptors(max_connections: int) -> None:
    """Raise the soft open-file limit to cover `max_connections` (two fds each, plus slack), or warn."""
    if not max_connections:
        return
    want = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning("open-file limit %d is below the %d that --max-connections %d needs: raise `ulimit -n` "
                    "or lower --max-connections", soft, want, max_connections)
