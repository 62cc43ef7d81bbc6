"""What a handler is given and what it answers: one request type, one whole response type, one
streamed response type. The server protocol (server.py) makes requests and writes answers;
nothing else in the project builds HTTP bytes for a client."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from vlmserve.http1.headers import TERMINATOR, Headers, chunk, response_head


class StreamListener(Protocol):
    """Told of the client's side while a streamed answer is relayed (the gateway's relay)."""

    def pause(self) -> None: ...

    def client_lost(self) -> None: ...


class ClientConnection(Protocol):
    """The server's connection as a request and a stream see it."""

    transport: asyncio.Transport | None
    writing_paused: bool
    listener: StreamListener | None

    async def drain(self) -> None: ...


class Request:
    """One request, its body whole (within the server's body limit)."""

    __slots__ = ("method", "target", "path", "headers", "body", "http10", "connection", "route")

    def __init__(
        self, method: str, target: str, path: str, headers: Headers, body: bytes, http10: bool, connection: ClientConnection
    ) -> None:
        self.method = method
        self.target = target  # the raw request target, as the client sent it
        self.path = path  # the checked path, or "" where the target was refused
        self.headers = headers
        self.body = body
        self.http10 = http10  # an HTTP/1.0 client: a streamed answer is not chunked, and ends with the close
        self.connection = connection
        self.route: Any = None  # the route table's entry (gateway/routes.py), set by the dispatcher

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.connection.transport


class Response:
    """A whole answer: status, headers, body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}

    @classmethod
    def json(cls, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return cls(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})})

    def to_bytes(self, *, close: bool, head_only: bool = False) -> bytes:
        head = response_head(self.status, self.headers.items(), length=len(self.body), close=close)
        return head if head_only else head + self.body


class Stream:
    """A streamed answer: the head leaves with the first payload (`start`, one write), each payload
    is framed as a chunk (or, to an HTTP/1.0 client, written as it is), `end` writes the last chunk.

    `render_head` may be called early (the gateway's relay renders it while the engine computes the
    first token)."""

    __slots__ = ("connection", "status", "headers", "chunked", "head", "started", "ended")

    def __init__(self, request: Request, status: int, headers: dict[str, str]) -> None:
        self.connection = request.connection
        self.status = status
        self.headers = headers
        self.chunked = not request.http10
        self.head = b""
        self.started = False
        self.ended = False

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.connection.transport

    def render_head(self) -> None:
        self.head = response_head(self.status, self.headers.items(), chunked=self.chunked, close=not self.chunked)

    def start(self, first: bytes) -> None:
        """The head and the first payload, in one write."""
        if not self.head:
            self.render_head()
        self.started = True
        transport = self.connection.transport
        if transport is not None and not transport.is_closing():
            transport.write(self.head + (chunk(first) if self.chunked else first))

    def write(self, payload: bytes) -> None:
        """One piece of payload; ConnectionResetError when the client is gone."""
        transport = self.connection.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        if payload:  # the hot path: framed here rather than through chunk(), one call less per piece
            transport.write(b"%x\r\n%s\r\n" % (len(payload), payload) if self.chunked else payload)

    def end(self, last: bytes = b"") -> None:
        """The last payload (if any) and the end of the body."""
        transport = self.connection.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        if self.chunked:
            transport.write(chunk(last) + TERMINATOR if last else TERMINATOR)
        elif last:
            transport.write(last)
        self.ended = True

    async def drain(self) -> None:
        await self.connection.drain()


Answer = Response | Stream
"""What a handler returns: a whole response (the server writes it) or a stream already written."""
