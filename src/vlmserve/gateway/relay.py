"""Relaying a replica's streamed answer to the client with as little work per chunk as possible.

Per chunk the relay runs as the replica connection's protocol: once the first bytes are out it
takes the transport over (`set_protocol`; upstream.py made the connection and gets it back at the
end), so every block arrives in `_on_data` straight from the event loop: no
task wake-up, no coroutine chain, no re-framing. When both sides speak chunked HTTP/1.1 (every
engine and every HTTP/1.1 client), the replica's bytes are passed on as they came, frames and
all. For a lean-lane client (lean_lane.py) the common block, one whole data frame that ends an
SSE event, takes an inline path: its length gives the only size line it can start with
(`_FRAME_HEADS`, one index and two prefix/suffix tests, nothing allocated), and then the only
work is a substring test for usage, a counter for the stall watchdog and one `transport.write`;
nothing of it is kept after the write.
Any other block (the first ones, split or merged frames, an event cut between frames, the end)
goes through `_take`, which walks the frames.

A lean client's stream can also start here: when the replica's head is in and its first body
bytes are not (engines send the head at once and the first token a TTFT later), the caller arms
the relay (`run` with no first bytes). Everything a stream needs is then built while the engine
computes, and the first body bytes leave with the client's head straight from `data_received`:
the first token waits for no task wake-up and no set-up. Until they come, nothing has reached
the client, so the caller still retries a replica that closes, sends an empty body or times out
(`RelayEnd.NOTHING_SENT`, `unsent`).

With a native pump (native_pump.py), a stream that has reached the inline path's conditions on
a plain-TCP connection leaves Python altogether: `_hand_to_pump` gives both sockets to the
pump (C, served by the event loop), which does what the inline path and `_take` do, and the relay
waits for its one report of the end (`_pump_ended`), in the same wait as for any other end.

A stream settled from the gateway's own count (its tenant has a token budget and the client did
not ask for `stream_options.include_usage`: `count_events`) counts its SSE events (`EventCounter`)
and so takes neither the inline path nor the pump: every block goes through `_take`, which counts
it. Blocks are not events: a fast engine or a slow client merges many events into one block (10
streams of 200 tokens counted as 22-32 blocks each), so a settle from blocks refunded most of the
output's charge. The pump counts blocks only (its C would need an SSE scanner to count events),
and the inline path is kept free of the work for the streams that do not need it.

What the gateway still guarantees on this path:
- Only whole frames reach the client; an incomplete frame is held until it completes, so a
  stream the gateway has to cut (replica died, stalled) still ends with a well-formed SSE
  error event and a proper end of body.
- The response's headers leave with the first bytes (one write); the end of body leaves with
  the last ones.
- Usage accounting: the last block that mentions `"usage"` is kept (by reference), with the
  block before it when that one ended inside an SSE event, and parsed once at the end; the
  policy learns the first token as before (engine prompt count in the first chunks, else after
  the second chunk).
- A client that reads slowly pauses reading from the replica (the client socket's own high
  water mark) until its buffer drains: memory per stream stays bounded. A lean client's
  protocol says so itself (`pause_writing` -> `pause`); for an aiohttp client the relay looks at
  the socket's buffer after each write.
- A client that goes away: its handler task is cancelled (a lean client first stops the inline
  path, `client_lost`); the caller closes the replica's connection and the engine aborts the
  request.

Per block, substrings are found with `bytes.find`, never `in`: CPython 3.11's `bytes in bytes` first
tries the right side as an integer and formats (then drops) a TypeError each time, which perf
showed as 3 % of the gateway's CPU at 256 streams.

The one aiohttp detail this depends on beyond its documented API: after `prepare()`,
`request.writer.chunked = False` makes `response.write()` pass bytes verbatim (the frames are
the replica's). tests/integration/gateway/test_relay.py (test_aiohttp_writer_passes_bytes_verbatim_once_unchunked) fails loudly if that changes.
"""

from __future__ import annotations

import asyncio
import enum
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

from vlmserve.http1.messages import Request as LeanRequest, Stream as LeanStream  # TEMP until the relay rewrite lands
from vlmserve.http1.server import HttpConnection as LeanConnection
from vlmserve.gateway.native_pump import NativePump, PumpResult
from vlmserve.gateway.upstream import (UpstreamClosed, UpstreamConnection, UpstreamError, UpstreamResponse,
                                       lost_mid_stream, malformed_body, walk_frames)
from vlmserve.gateway.watchdog import Exchange

TERMINATOR = b"0\r\n\r\n"
USAGE_KEY = b'"usage"'  # a block that holds it may carry the engine's token counts
_PROMPT_KEY = b'"prompt_tokens"'
_PROMPT_TOKENS = re.compile(re.escape(_PROMPT_KEY) + rb":\s*(\d+)")
_HEX_SIZE = re.compile(rb"[0-9a-fA-F]{1,8}")
_SIZES_SEEN: dict[bytes, int] = {}  # size line -> size (> 0), for _take's one-whole-frame test (a few hundred spellings)
_INLINE_MAX = 4102  # the longest block _on_data's inline path takes: a frame with a 3-digit size line
_EVENT_LINE = b"\ndata:"  # an SSE data line's start: the only place a raw LF can precede it (JSON escapes its own)
_DONE_LINE = b"\ndata: [DONE]"  # the end-of-stream line, which carries no completion chunk


class EventCounter:
    """Counts a stream's SSE events that carry a completion chunk (data lines, less `[DONE]`), from
    its blocks as they arrive, whatever the blocks' sizes: a line start cut between two blocks is
    found by looking at the last bytes of the one before (`tail`) with the first of the next.

    Counted on the replica's bytes as sent, HTTP/1.1 frame lines included: a size line ends in LF,
    so an event at the start of a frame is found too; an engine writes each event whole within a
    frame (vLLM and the sim do), which the count assumes. With vLLM's default stream_interval=1 an
    event carries one token of one choice (with `n` > 1 each choice has its own events), so the
    count is the output's tokens, plus one role event per choice on chat routes; where an engine
    puts several tokens in one event the count is a lower bound."""

    __slots__ = ("lines", "done_lines", "tail")

    def __init__(self) -> None:
        self.lines = 0
        self.done_lines = 0
        self.tail = b"\n"  # the body's first byte starts a line (an unframed body starts with its first event)

    @property
    def events(self) -> int:
        return max(0, self.lines - self.done_lines)

    def feed(self, block: bytes) -> None:
        tail = self.tail
        self.lines += _count_across(tail, block, _EVENT_LINE)
        self.done_lines += _count_across(tail, block, _DONE_LINE)
        keep = len(_DONE_LINE) - 1
        self.tail = block[-keep:] if len(block) >= keep else (tail + block)[-keep:]


def _count_across(tail: bytes, block: bytes, pattern: bytes) -> int:
    """Occurrences of `pattern` that end in `block`: those inside it, and those begun in the bytes
    before it (`tail`). Neither short piece joined below can hold a whole one, so none is counted
    twice."""
    cut = len(pattern) - 1
    return block.count(pattern) + (tail[-cut:] + block[:cut]).count(pattern)


def _frame_heads() -> tuple[bytes, ...]:
    """For each block length up to _INLINE_MAX, the size line (lowercase hex, as engines write it)
    that a block of exactly one whole frame of that length starts with. A frame of n bytes has a
    k-digit size line and n - k - 4 payload bytes, and the three ranges of k give disjoint
    lengths, so each length has at most one; a length that no frame has gets a line longer than
    the block, which no block starts with."""
    heads = []
    for length in range(_INLINE_MAX + 1):
        head = b"-" * (length + 1)
        for digits, low, high in ((1, 1, 0xF), (2, 0x10, 0xFF), (3, 0x100, 0xFFF)):
            if low <= length - digits - 4 <= high:
                head = b"%x\r\n" % (length - digits - 4)
        heads.append(head)
    return tuple(heads)


_FRAME_HEADS = _frame_heads()


def _frame_size(line: bytes) -> int | None:
    """A plain hex size line's value (no extensions, no sign, no prefix), else None."""
    size = _SIZES_SEEN.get(line)
    if size is None and _HEX_SIZE.fullmatch(line) is not None:
        size = int(line, 16)
        if size and len(_SIZES_SEEN) < 4096:  # never 0: the last chunk is not a data frame
            _SIZES_SEEN[line] = size
    return size


class RelayEnd(enum.Enum):
    COMPLETED = "completed"  # the replica's body ended and the client has all of it
    UPSTREAM_FAILED = "upstream_failed"  # the replica's connection broke (or sent garbage) mid-body
    CLIENT_GONE = "client_gone"
    NOTHING_SENT = "nothing_sent"  # armed, and the replica's body closed, failed or was empty before its first byte


class StreamRelay(asyncio.Protocol):
    """One streamed answer, from the replica's first body bytes to the end of the client's body."""

    # The inline path's slots first: an object's slots lie in this order, so those four share a cache line.
    __slots__ = ("fast", "write", "exchange", "usage_block", "upstream", "connection", "request", "on_first_token",
                 "client", "first_token_pending", "held", "unfinished", "taken", "usage_prev", "end", "error",
                 "waiter", "paused", "high_water", "upstream_received", "framed_out", "payload_only", "verbatim",
                 "first_sent_mono", "lean_client", "holds_transport", "pump", "pumped", "pump_paused", "armed_stream",
                 "on_start", "unsent", "events")

    def __init__(self, upstream: UpstreamResponse, request: web.Request | LeanRequest, exchange: Exchange,
                 on_first_token: Callable[[int | None], None], pump: NativePump | None = None,
                 on_start: Callable[[], None] | None = None, count_events: bool = False) -> None:
        self.upstream = upstream
        self.connection: UpstreamConnection = upstream.connection
        self.request = request
        self.exchange = exchange
        self.on_first_token = on_first_token  # called once with the engine's prompt token count (or None)
        self.client: asyncio.Transport | None = None
        self.write: Callable[[bytes], None] | None = None
        self.first_token_pending = True
        self.held = b""  # an incomplete frame, held until the rest of it arrives
        # The last block when it ended inside an SSE event, so that a usage event begun there can be
        # read whole with the next; b"" when it ended on an event boundary (the common case: no block
        # is kept alive past its write, and the next read reuses its memory while it is still cached).
        self.unfinished = b""
        self.taken = 0  # blocks with whole frames passed on by _take (the first token comes by the second)
        self.usage_prev = b""
        self.usage_block = b""
        self.end: RelayEnd | None = None
        self.error = ""
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.high_water = 65536
        self.upstream_received = 0
        self.framed_out = True  # the client takes chunked framing (HTTP/1.1)
        self.payload_only = False  # the replica's body is not chunked: frame (or pass) its bytes as they come
        self.verbatim = False  # the client's writer passes bytes as they are (the replica's frames)
        self.first_sent_mono: float | None = None
        self.lean_client: LeanConnection | None = None  # a lean-lane client: it reports its loss and back-pressure here
        self.fast = False  # whole frames take _on_data's inline path (see _update_fast)
        self.holds_transport = False  # the replica's transport delivers to this relay (set_protocol)
        self.pump = pump  # hands the stream to C once it is in its steady state (_hand_to_pump)
        self.pumped: int | None = None  # the pump's handle for this stream while it holds it
        self.pump_paused = False  # the replica's transport stopped reading while the pump read its socket
        self.armed_stream: LeanStream | None = None  # armed: its head leaves with the first body bytes (_start)
        self.on_start = on_start  # called once the first bytes are out (the caller's "no more retries")
        self.unsent: BaseException | None = None  # NOTHING_SENT by a lost connection: what the caller retries on
        # the stream's SSE events, counted where its settle needs them (module docstring); None: not counted
        self.events: EventCounter | None = EventCounter() if count_events else None

    async def run(self, response: web.StreamResponse | LeanStream, first: bytes | None) -> RelayEnd:
        """Send the head with the first bytes, then relay from `data_received` until the body ends.

        With `first` None (a lean client and a chunked replica body not begun: armed, see the
        module docstring) the head waits for the first body bytes, which `_start` sends."""
        request = self.request
        self.payload_only = not self.upstream.chunked
        drain: Callable[[], Awaitable[None]]
        if isinstance(response, LeanStream):  # lean_lane.py: an HTTP/1.1 client, the head written here
            self.verbatim = True
            if first is None:
                response.render_head()
                self.armed_stream = response
            else:
                response.start(self._take(first))
            drain = response.drain
            self.lean_client = response.connection
        else:
            assert first is not None, "only a lean client's stream is armed"
            aiohttp_request = cast(web.Request, request)
            await response.prepare(aiohttp_request)
            writer = cast(Any, aiohttp_request.writer)  # aiohttp's StreamWriter
            self.framed_out = bool(getattr(writer, "chunked", False))
            if self.framed_out:
                writer.chunked = False  # the relay writes the frames itself (module docstring)
                self.verbatim = True
            await response.write(self._take(first))  # the head and the first frames in one write
            drain = writer.drain
        if first is not None:
            self.first_sent_mono = time.monotonic()
        if self.end is not None:
            return self.end
        client = request.transport
        if client is None or client.is_closing():
            return RelayEnd.CLIENT_GONE
        self.client = client
        self.write = client.write
        high = client.get_write_buffer_limits()[1] if hasattr(client, "get_write_buffer_limits") else 65536
        self.high_water = high or 65536
        connection = self.connection
        loop = connection.loop
        # bytes that came while the head was being written, then everything else from data_received
        early, connection.body = connection.body, []
        lean_client = self.lean_client
        if lean_client is not None:
            lean_client.relay = self  # from here on its connection_lost and pause_writing reach the relay
            if lean_client.writing_paused:
                self.pause()
        self._update_fast()
        connection.sink_lost = self._on_lost
        transport = connection.transport
        if transport is not None and not connection.closed:
            transport.set_protocol(self)  # the replica's blocks reach _on_data directly (data_received below)
            self.holds_transport = True
        for block in early:
            self._on_data(block)
        if connection.closed and self.end is None:
            self._on_lost(connection.error if isinstance(connection.error, Exception) else None)
        while self.end is None:
            self.waiter = loop.create_future()
            try:
                await self.waiter
            except asyncio.CancelledError:  # the watchdog, or the client gone
                if self.pumped is not None and self.pump is not None:
                    self.pump.cancel(self.pumped)  # the pump lets go of the sockets now (_pump_ended)
                raise
            finally:
                self.waiter = None
            if self.paused and self.end is None:
                await drain()  # until the client's socket takes bytes again
                self.paused = False
                transport = connection.transport
                if transport is not None and not connection.closed:
                    transport.resume_reading()
        return self.end

    def detach(self) -> None:
        """Stop taking the replica's bytes (the stream is being cut or is over)."""
        connection = self.connection
        connection.sink_lost = None
        self.fast = False
        if self.lean_client is not None:
            self.lean_client.relay = None
        if self.holds_transport:
            self.holds_transport = False
            transport = connection.transport
            if transport is not None:
                transport.set_protocol(connection)
        if self.pump_paused:
            self.pump_paused = False
            transport = connection.transport
            if transport is not None and not connection.closed:
                transport.resume_reading()  # a pooled connection reads again (to see the replica close it)

    # ---- the replica's socket while the relay holds it (asyncio.Protocol) ------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass  # the connection was made long before; the relay only takes it over

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.connection_lost(exc)  # marks it closed and calls sink_lost (_on_lost)

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        pass  # the request went out before the relay took over

    def resume_writing(self) -> None:
        pass

    # ---- per chunk ---------------------------------------------------------------------------

    def _on_data(self, data: bytes) -> None:
        """The hot path: one block from the replica's socket, passed on."""
        size = len(data)
        if self.fast and size <= _INLINE_MAX and data.startswith(_FRAME_HEADS[size]) and data.endswith(b"\n\n\r\n"):
            # The common block, one whole data frame ending an SSE event: what _take and the client
            # checks below do for it, inline (the lean client's protocol reports its loss and
            # back-pressure: _update_fast). Nothing is kept of it unless it carries usage.
            self.exchange.chunks += 1
            if data.find(USAGE_KEY) >= 0:  # not `in`: see the module docstring
                self.usage_prev, self.usage_block = b"", data
            # read into a local first: CPython 3.11 cannot specialise calling a callable held in a slot
            write = self.write
            write(data)  # type: ignore[misc]
            return
        if self.armed_stream is not None:
            self._start(data)
            return
        out = self._take(data)
        if out:
            client = self.client
            assert client is not None and self.write is not None
            if client.is_closing():
                self._finish(RelayEnd.CLIENT_GONE)
                return
            self.write(out)
            # a lean client's protocol reports back-pressure itself (pause_writing -> pause)
            if self.lean_client is None and client.get_write_buffer_size() > self.high_water:
                self.pause()
        self._update_fast()
        if self.end is not None:
            self._wake()

    data_received = _on_data  # uvloop calls it for every block, with no hop through UpstreamConnection

    def _start(self, data: bytes) -> None:
        """Armed: the replica's first body bytes, out with the client's head in one write."""
        stream, self.armed_stream = self.armed_stream, None
        assert stream is not None
        # Nothing is sent (the caller retries) for an empty body, or when the first-token timeout
        # has already cancelled the caller: this block came too late to be this attempt's first.
        if data.startswith(b"0\r\n") or self.exchange.expired:
            self.end = RelayEnd.NOTHING_SENT
            self._wake()
            return
        stream.start(self._take(data))
        self.first_sent_mono = time.monotonic()
        if self.on_start is not None:
            self.on_start()
        self._update_fast()
        if self.end is not None:
            self._wake()

    def _update_fast(self) -> None:
        """Whole frames may take _on_data's inline path: the replica's frames go out verbatim to a
        lean client (whose loss and back-pressure reach the relay through its protocol, so no
        per-block check is needed), no partial frame is held, and the first token is accounted.
        Never for a stream that counts its events: neither this path nor the pump (only reached
        from here) counts them."""
        self.fast = (self.lean_client is not None and self.verbatim and not self.payload_only and not self.held
                     and not self.unfinished and not self.first_token_pending and self.end is None
                     and self.write is not None and self.events is None)
        if self.fast and self.pump is not None and self.pumped is None and not self.paused:
            self._hand_to_pump()

    def _hand_to_pump(self) -> None:
        """Give both sockets to the native pump (native_pump.py) when they are plain TCP and
        nothing waits in the client's write buffer (it would go out after the pump's bytes)."""
        pump, client, transport = self.pump, self.client, self.connection.transport
        if pump is None or client is None or transport is None or client.get_write_buffer_size():
            return
        if client.get_extra_info("sslcontext") is not None or transport.get_extra_info("sslcontext") is not None:
            return
        client_socket, upstream_socket = client.get_extra_info("socket"), transport.get_extra_info("socket")
        if client_socket is None or upstream_socket is None:
            return
        transport.pause_reading()  # the event loop stops polling the replica's socket; the pump polls it
        try:
            handle = pump.start(upstream_socket.fileno(), client_socket.fileno(), self._pump_ended)
        except OSError:
            transport.resume_reading()
            self.pump = None  # this stream stays in Python
            return
        self.pumped = handle
        self.pump_paused = True
        self.fast = False
        self.exchange.native_chunks = lambda: pump.chunks(handle)

    def _pump_ended(self, result: PumpResult) -> None:
        """The pump's one report (or a cancel's), taken back into the relay's state."""
        self.pumped = None
        exchange = self.exchange
        exchange.native_chunks = None
        exchange.chunks += result.chunks
        if result.usage_block:
            self.usage_prev, self.usage_block = result.usage_prev, result.usage_block
        self.held = result.held
        if result.completed:
            if result.trailing:
                self.upstream.keep_alive = False
            self.upstream.finished()
            self.end = RelayEnd.COMPLETED
        elif result.upstream_failed:
            self.error = result.why()
            self.end = RelayEnd.UPSTREAM_FAILED
        else:  # the client's socket hung up or refused a write, or the lean lane saw it go (cancel)
            self.end = RelayEnd.CLIENT_GONE
        self._wake()

    def client_lost(self) -> None:
        """The lean client's connection is gone (its protocol says so): no more inline writes."""
        self.fast = False
        if self.pumped is not None and self.pump is not None:
            self.pump.cancel(self.pumped)  # reports the end (_pump_ended)

    def _take(self, data: bytes) -> bytes:
        """What of `data` goes to the client now (whole frames only), noting progress and usage."""
        exchange = self.exchange
        exchange.chunks += 1
        self.upstream_received += len(data)
        events = self.events
        if events is not None:
            events.feed(data)
        if self.payload_only:
            return self._take_unframed(data)
        if self.held:
            data = self.held + data
            self.held = b""
        # The common block is one whole data frame: its size line says where it ends.
        eol = data.find(b"\r\n", 0, 18)
        size = _frame_size(data[:eol]) if eol > 0 else None
        if size and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
            boundary, end = len(data), -1
        else:
            try:
                boundary, end = walk_frames(data)
            except UpstreamError as err:
                self._fail(malformed_body(err))
                return b""
        if end >= 0:
            out = data[:boundary]
            if end < len(data):
                self.upstream.keep_alive = False  # bytes after the body: never reuse this connection
            self.upstream.finished()
            self.end = RelayEnd.COMPLETED
        elif boundary < len(data):
            out = data[:boundary]
            self.held = data[boundary:]
        else:
            out = data
        if out:
            self.taken += 1
        if self.first_token_pending:
            self._check_first_token(out)
        if out.find(USAGE_KEY) >= 0:
            self.usage_prev = self.unfinished
            self.usage_block = out
        if out:
            self.unfinished = b"" if out.endswith(b"\n\n\r\n") else out
        if not self.framed_out:  # an HTTP/1.0 client: payload only, the end of body is the close
            payload: list[bytes] = []
            walk_frames(out + TERMINATOR, payload)
            return b"".join(payload)
        if self.end is RelayEnd.COMPLETED:
            return out + TERMINATOR
        return out

    def _take_unframed(self, data: bytes) -> bytes:
        """A replica body with Content-Length or ended by close: frame it for an HTTP/1.1 client."""
        length = self.upstream.length
        if length is not None and self.upstream_received >= length:
            data = data[: len(data) - (self.upstream_received - length)]
            self.upstream.finished()
            self.end = RelayEnd.COMPLETED
        if data:
            self.taken += 1
        if self.first_token_pending:
            self._check_first_token(data)
        if data.find(USAGE_KEY) >= 0:
            self.usage_prev, self.usage_block = self.unfinished, data
        if data:
            self.unfinished = b"" if data.endswith(b"\n\n") else data
        if not self.framed_out:
            return data
        out = b"%x\r\n%s\r\n" % (len(data), data) if data else b""
        return out + TERMINATOR if self.end is RelayEnd.COMPLETED else out

    def _check_first_token(self, out: bytes) -> None:
        # the regex only where the key is (a byte search is many times faster than the regex's scan)
        match = None
        at = out.find(_PROMPT_KEY)
        while at >= 0:
            match = _PROMPT_TOKENS.match(out, at)
            if match is not None:
                break
            at = out.find(_PROMPT_KEY, at + 1)
        if match is not None or self.taken > 1:  # usage in the first chunks, or this is the second block
            self.first_token_pending = False
            self.on_first_token(int(match.group(1)) if match is not None else None)

    def _on_lost(self, exc: BaseException | None) -> None:
        if self.end is not None:
            return
        if self.armed_stream is not None:  # closed before its first body bytes: nothing was sent
            self.armed_stream = None
            self.unsent = exc if isinstance(exc, Exception) else UpstreamClosed("replica closed the connection before the body")
            self.end = RelayEnd.NOTHING_SENT
            self._wake()
            return
        if self.payload_only and self.upstream.length is None and exc is None:
            if self.framed_out and self.write is not None and not self.held:
                self.write(TERMINATOR)  # a body delimited by the close has ended
            self.end = RelayEnd.COMPLETED
            self._wake()
            return
        self._fail(lost_mid_stream(None if exc is None else type(exc).__name__))

    def _fail(self, why: str) -> None:
        self.error = why
        self.detach()
        self._finish(RelayEnd.UPSTREAM_FAILED)

    def _finish(self, end: RelayEnd) -> None:
        if self.end is None:
            self.end = end
        self.fast = False
        self._wake()

    def pause(self) -> None:
        """The client's socket is full (a lean client's pause_writing, or the buffer seen after a
        write): stop reading the replica until it drains."""
        transport = self.connection.transport
        if transport is not None and not self.paused and self.end is None:
            transport.pause_reading()
            self.paused = True
            self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- at the end ----------------------------------------------------------------------------

    def usage_payload(self) -> bytes:
        """The SSE text of the last frames that carried usage (engines send it last)."""
        raw = self.usage_prev + self.usage_block
        if not raw or self.payload_only:
            return raw
        payload: list[bytes] = []
        try:
            walk_frames(raw + TERMINATOR, payload)
        except UpstreamError:
            return raw
        return b"".join(payload)
