"""The gateway's replica side on real sockets, without the rest of the gateway.

- `ScriptedReplica`: an HTTP/1.1 server that answers each POST with the bytes a test's script
  writes, split and timed as the script says (and GET /health, /v1/models as an engine does).
- `ClientSide`: the client connection as the gateway's server gives it to a handler (it implements
  `http1.messages.ClientConnection`: back-pressure and loss reach the relay through `listener`).
  It reads one request, hands an `http1.messages.Request` to the handler, writes a `Response` or
  leaves a `Stream` as written, and closes the connection after an HTTP/1.0 stream.
- `ForwardingHarness`: a real `Forwarder` (replica pool, upstream pool, watchdog, retry budget)
  behind a `ClientSide` server, with a policy that records its hooks.
- `read_answer`: a raw-socket client that reads the answer with the project's response reader.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.gateway_fixtures import MODEL
from vlmserve.gateway.proxy import Forwarder, RequestLog
from vlmserve.gateway.replicas import Replica, ReplicaPool
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.retry_budget import RetryBudget
from vlmserve.gateway.routing import Outcome, RoutingPolicy
from vlmserve.gateway.watchdog import Watchdog
from vlmserve.http1.client import ClientPool
from vlmserve.http1.headers import Headers
from vlmserve.http1.messages import Answer, Request, Response, StreamListener
from vlmserve.http1.reader import ProtocolError, ResponseHead, ResponseReader

Script = Callable[[asyncio.StreamWriter], Awaitable[None]]
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def token(text: str, usage: dict | None = None) -> bytes:
    payload: dict = {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    if usage is not None:
        payload["usage"] = usage
    return event(payload)


async def send(writer: asyncio.StreamWriter, *pieces: bytes, pause_s: float = 0.0) -> None:
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        if pause_s:
            await asyncio.sleep(pause_s)


@dataclass
class ScriptedReplica:
    """An HTTP/1.1 server: GET /health and /v1/models answer; each POST runs the next script.

    A script that returns leaves the connection open for the next request (keep-alive) unless it
    closed it; `closed_at` notes when the gateway closed a POST's connection."""

    scripts: list[Script] = field(default_factory=list)
    port: int = 0
    closed_at: list[float] = field(default_factory=list)
    posts: int = 0
    heads: list[str] = field(default_factory=list)  # each POST's request head, as received
    connections: int = 0
    keep_alive: bool = False  # after a script, read the next request on the same connection

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                if method == "GET":
                    body = json.dumps(
                        {"object": "list", "data": [{"id": MODEL, "object": "model"}]} if path == "/v1/models" else {}
                    ).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    await writer.drain()
                    continue
                self.posts += 1
                self.heads.append(head.decode("latin-1"))
                script = self.scripts.pop(0)
                if self.keep_alive:
                    await script(writer)
                    continue
                watcher = asyncio.ensure_future(self._watch_close(reader))
                try:
                    await script(writer)
                except ConnectionError:  # a write met the gateway's reset: the connection is closed all the same
                    if not watcher.done():
                        self.closed_at.append(time.monotonic())
                    raise
                finally:
                    if not watcher.done():
                        watcher.cancel()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            if self.keep_alive:
                self.closed_at.append(time.monotonic())
        except asyncio.CancelledError:
            # the test ended while a script still ran (the gateway hung up first): Python 3.11's
            # start_server logs a cancelled handler as an error with a traceback
            pass
        finally:
            writer.close()

    async def _watch_close(self, reader: asyncio.StreamReader) -> None:
        """Note when the gateway closes the connection: an EOF, or a reset."""
        try:
            await reader.read()
        except ConnectionError:
            pass
        self.closed_at.append(time.monotonic())


@asynccontextmanager
async def scripted_replica(*scripts: Script, keep_alive: bool = False) -> AsyncIterator[ScriptedReplica]:
    replica = ScriptedReplica(list(scripts), keep_alive=keep_alive)
    server = await asyncio.start_server(replica.handle, "127.0.0.1", 0)
    replica.port = server.sockets[0].getsockname()[1]
    try:
        yield replica
    finally:
        server.close()


Handler = Callable[[Request], Awaitable[Answer]]


class ClientSide(asyncio.Protocol):
    """One client connection, serving one request with `handler` (http1.messages.ClientConnection)."""

    def __init__(self, handler: Handler, high_water: int | None, send_buffer: int | None = None) -> None:
        self.handler = handler
        self.high_water = high_water
        self.send_buffer = send_buffer
        self.transport: asyncio.Transport | None = None
        self.writing_paused = False
        self.listener: StreamListener | None = None
        self.pauses = 0  # times the socket filled (the relay was told to pause)
        self.buffer = b""
        self.task: asyncio.Task | None = None
        self.failed: Exception | None = None
        self._drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.high_water is not None:
            self.transport.set_write_buffer_limits(high=self.high_water)  # type: ignore[union-attr]
        if self.send_buffer is not None:  # a small kernel buffer: a slow client fills it, and then the transport's
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)

    def data_received(self, data: bytes) -> None:
        if self.task is not None:
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        headers = Headers()
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.add(name.encode(), value.strip().encode())
        length = int(headers.get("content-length", "0"))
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        request = Request(method, target, target.partition("?")[0], headers, body, version == "HTTP/1.0", self)
        self.task = asyncio.ensure_future(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            answer = await self.handler(request)
        except Exception as err:  # a defect of the code under test: the test fails on it (forwarding)
            self.failed = err
            if self.transport is not None:
                self.transport.close()
            return
        transport = self.transport
        if transport is None:
            return
        if isinstance(answer, Response):
            transport.write(answer.to_bytes(close=request.http10))
        elif not answer.ended or not answer.chunked:
            transport.close()  # a stream cut short, or one whose end is the close (HTTP/1.0)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.listener is not None:
            self.listener.client_lost()
        if self.task is not None:
            self.task.cancel()
        self._wake()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.pauses += 1
        if self.listener is not None:
            self.listener.pause()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    def _wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if not self.writing_paused or self.transport is None:
            return
        self._drained = asyncio.get_running_loop().create_future()
        try:
            await self._drained
        finally:
            self._drained = None


class RecordingPolicy(RoutingPolicy):
    """Routes to the first candidate; records its hooks (each attempt must finish exactly once)."""

    name = "recording"

    def __init__(self) -> None:
        self.dispatched = 0
        self.first_tokens = 0
        self.finished: list[Outcome] = []

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        return candidates[0]

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self.dispatched += 1

    def on_first_token(self, request: RoutedRequest, replica: Replica) -> None:
        self.first_tokens += 1

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        self.finished.append(outcome)


@dataclass
class ForwardingHarness:
    """A real Forwarder behind a ClientSide server on a local port."""

    forwarder: Forwarder
    policy: RecordingPolicy
    pool: ReplicaPool
    upstream: ClientPool
    port: int = 0
    logs: list[RequestLog] = field(default_factory=list)
    clients: list[ClientSide] = field(default_factory=list)
    counts_events: bool = False

    async def handle(self, request: Request) -> Answer:
        log = RequestLog(request_id=f"r{len(self.logs)}", path=request.path, stream=True, received_mono=time.monotonic())
        self.logs.append(log)
        routed = RoutedRequest(
            request_id=log.request_id,
            model=None,
            stream=True,
            prompt_tokens=8,
            expected_output_tokens=16,
            counts_events=self.counts_events,
        )
        return await self.forwarder.forward(request, request.body, routed, log)

    def in_flight(self) -> int:
        return sum(replica.in_flight for replica in self.pool.replicas)


@asynccontextmanager
async def forwarding(
    urls: list[str],
    *,
    high_water: int | None = None,
    send_buffer: int | None = None,
    max_attempts: int = 3,
    idle_chunk_timeout_s: float = 30.0,
    first_token_timeout_s: float = 30.0,
    counts_events: bool = False,
    watchdog_tick_s: float = 0.05,
) -> AsyncIterator[ForwardingHarness]:
    pool = ReplicaPool(urls)
    for replica in pool.replicas:
        replica.healthy = True  # no probes here: the scripted replicas are taken to be up
    upstream = ClientPool(connect_timeout_s=2)
    watchdog = Watchdog(tick_s=watchdog_tick_s)
    watchdog.start()
    policy = RecordingPolicy()
    forwarder = Forwarder(
        pool,
        policy,
        upstream,
        watchdog,
        max_attempts=max_attempts,
        retry_budget=RetryBudget(1.0, 100.0),
        idle_chunk_timeout_s=idle_chunk_timeout_s,
        first_token_timeout_s=first_token_timeout_s,
    )
    harness = ForwardingHarness(forwarder, policy, pool, upstream, counts_events=counts_events)

    def client() -> ClientSide:
        side = ClientSide(harness.handle, high_water, send_buffer)
        harness.clients.append(side)
        return side

    server = await asyncio.get_running_loop().create_server(client, "127.0.0.1", 0)
    harness.port = server.sockets[0].getsockname()[1]
    try:
        yield harness
        failures = [client.failed for client in harness.clients if client.failed is not None]
        assert not failures, failures
    finally:
        server.close()
        upstream.close()
        await watchdog.stop()


def chat_request(http10: bool = False, body: bytes = b'{"stream": true}') -> bytes:
    version = b"HTTP/1.0" if http10 else b"HTTP/1.1"
    return b"POST /v1/chat/completions %s\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        version,
        len(body),
        body,
    )


@dataclass
class ClientView:
    """What a client read: the head, the de-chunked payload, whether the body ended, the raw bytes."""

    head: ResponseHead | None = None
    payload: bytes = b""
    ended: bool = False
    raw: bytes = b""
    error: str | None = None

    def on_response_head(self, head: ResponseHead) -> None:
        self.head = head

    def on_response_body(self, data: bytes) -> None:
        self.payload += data

    def on_response_end(self) -> None:
        self.ended = True

    def events(self) -> list[dict[str, Any]]:
        """The payload's SSE data events, parsed ([DONE] left out); a partial event fails the test."""
        out = []
        for block in self.payload.split(b"\n\n"):
            if not block:
                continue
            assert block.startswith(b"data: "), f"not a whole SSE event: {block[:80]!r}"
            if block != b"data: [DONE]":
                out.append(json.loads(block[6:]))
        assert self.payload.endswith(b"\n\n") or not self.payload, f"the payload ends inside an event: {self.payload[-80:]!r}"
        return out

    def texts(self) -> list[str]:
        return [e["choices"][0]["delta"]["content"] for e in self.events() if e.get("choices")]

    def error_event(self) -> dict[str, Any] | None:
        errors = [e["error"] for e in self.events() if "error" in e]
        assert len(errors) <= 1
        return errors[0] if errors else None


async def read_answer(
    port: int,
    *,
    http10: bool = False,
    request: bytes | None = None,
    timeout_s: float = 10.0,
    read_delays: Callable[[], float] | None = None,
    receive_buffer: int | None = None,
    on_first: Callable[[bytes], None] | None = None,
) -> ClientView:
    """Send one request on a fresh connection and read the answer to its end (or the close).
    `read_delays` gives a pause before each read: a client that reads slowly."""
    sock = socket.socket()
    if receive_buffer is not None:  # set before connecting: the window is agreed then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    answer = ClientView()
    parser = ResponseReader(answer)
    parser.expect()
    writer.write(request or chat_request(http10))
    try:
        async with asyncio.timeout(timeout_s):
            while not answer.ended:
                if read_delays is not None:
                    await asyncio.sleep(read_delays())
                data = await reader.read(4096)
                if not data:
                    parser.feed_eof()
                    break
                if on_first is not None and not answer.raw:
                    on_first(data)
                answer.raw += data
                try:
                    parser.feed(data)
                except ProtocolError as err:
                    answer.error = str(err)
                    break
    finally:
        writer.close()
    return answer
