"""Relaying a replica's streamed answer to the client: an explicit state machine.

The replica's connection (http1/client.py) hands the relay each piece of payload as llhttp de-chunks
it, synchronously from the socket's `data_received`; the relay writes it to the client through
`http1.messages.Stream`, which frames it as a chunk (or writes it as it is to an HTTP/1.0 client).
No task wakes per chunk. The caller (proxy.py) awaits `run` once, for the end.

States, and what each does with each event (one handler per state and event, `_HANDLERS`):

  ARMED      the replica's head is in, its first payload is not: nothing has reached the client,
             so the caller may still retry. The client's head is rendered now, while the engine
             computes, and leaves with the first payload in one write (`Stream.start`).
             payload -> STREAMING; end (empty body), replica lost or malformed -> ENDED(NOTHING_SENT).
  STREAMING  each payload is written as it comes. pause -> PAUSED; end -> ENDED(COMPLETED);
             replica lost or malformed -> ENDED(UPSTREAM_FAILED).
  PAUSED     the client's socket is full (`listener.pause()`): the replica is not read until
             `Stream.drain()` returns (`run`), then STREAMING again. Payload already read is written.
  ENDED      every event is ignored; `run` returns the reason.
  Client lost (`listener.client_lost()`) -> ENDED(CLIENT_GONE) from every state but ENDED.

What the gateway guarantees on this path:
- Only whole SSE events reach the client: the payload after the last event's end (`\\n\\n`) is held
  until its event ends, so a stream the gateway has to cut (replica died, stalled, sent garbage)
  still ends with a well-formed SSE error event (`cut`) and a proper end of body. Held bytes are
  bounded (`MAX_HELD_BYTES`): past that they go out, and a cut first ends the open event.
- The response's head leaves with the first payload (one write); the end of body leaves as the
  replica's ends, from the relay (`Stream.end`).
- Usage accounting: the last written piece that mentions `"usage"` is kept (it holds whole events)
  and parsed once at the end. The policy learns the first token as before: the engine's prompt
  count in the first pieces, else after the second.
- A stream settled from the gateway's own count (a token budget and no `include_usage`:
  `count_events`) counts its SSE events on the payload (`EventCounter`): pieces are not events.
- A client that reads slowly stops the reading of the replica until its socket drains: memory per
  stream stays bounded. A client that goes away ends the stream at once; the caller closes the
  replica's connection and the engine aborts the request.

Per piece, substrings are found with `bytes.find`, never `in`: CPython 3.11's `bytes in bytes` first
tries the right side as an integer and formats (then drops) a TypeError each time.
"""

from __future__ import annotations

import asyncio
import enum
import re
import time
from collections.abc import Callable

from vlmserve.gateway.watchdog import Exchange
from vlmserve.http1.client import ClientConnection, ClientError, ClientResponse, ServerClosed
from vlmserve.http1.messages import Stream

USAGE_KEY = b'"usage"'  # a piece that holds it may carry the engine's token counts
_PROMPT_KEY = b'"prompt_tokens"'
_PROMPT_TOKENS = re.compile(re.escape(_PROMPT_KEY) + rb":\s*(\d+)")
_EVENT_END = b"\n\n"  # how vLLM and the sim end an SSE event
_EVENT_END_CRLF = b"\n\r\n"  # the end of one written with CRLF line ends
_EVENT_LINE = b"\ndata:"  # an SSE data line's start: the only place a raw LF can precede it (JSON escapes its own)
_DONE_LINE = b"\ndata: [DONE]"  # the end-of-stream line, which carries no completion chunk
MAX_HELD_BYTES = 1 << 20  # an SSE event longer than this is passed on before its end


class EventCounter:
    """Counts a stream's SSE events that carry a completion chunk (data lines, less `[DONE]`), from
    its payload as it arrives, whatever the pieces' sizes: a line start cut between two pieces is
    found by looking at the last bytes of the one before (`tail`) with the first of the next.

    With vLLM's default stream_interval=1 an event carries one token of one choice (with `n` > 1
    each choice has its own events), so the count is the output's tokens, plus one role event per
    choice on chat routes; where an engine puts several tokens in one event the count is a lower
    bound."""

    __slots__ = ("lines", "done_lines", "tail")

    def __init__(self) -> None:
        self.lines = 0
        self.done_lines = 0
        self.tail = b"\n"  # the body's first byte starts a line

    @property
    def events(self) -> int:
        return max(0, self.lines - self.done_lines)

    def feed(self, piece: bytes) -> None:
        tail = self.tail
        self.lines += _count_across(tail, piece, _EVENT_LINE)
        self.done_lines += _count_across(tail, piece, _DONE_LINE)
        keep = len(_DONE_LINE) - 1
        self.tail = piece[-keep:] if len(piece) >= keep else (tail + piece)[-keep:]


def _count_across(tail: bytes, piece: bytes, pattern: bytes) -> int:
    """Occurrences of `pattern` that end in `piece`: those inside it, and those begun in the bytes
    before it (`tail`). Neither short piece joined below can hold a whole one, so none is counted
    twice."""
    cut = len(pattern) - 1
    return piece.count(pattern) + (tail[-cut:] + piece[:cut]).count(pattern)


def _events_end(data: bytes) -> int:
    """Where the last whole SSE event in `data` ends (0: none ends in it)."""
    lf = data.rfind(_EVENT_END)
    crlf = data.rfind(_EVENT_END_CRLF)
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _nothing(*_: object) -> None:
    """Every event's handler once the relay is detached."""


class RelayState(enum.Enum):
    ARMED = "armed"
    STREAMING = "streaming"
    PAUSED = "paused"
    ENDED = "ended"


class RelayEnd(enum.Enum):
    COMPLETED = "completed"  # the replica's body ended and the client has all of it
    UPSTREAM_FAILED = "upstream_failed"  # the replica's connection broke (or sent garbage) mid-body
    CLIENT_GONE = "client_gone"
    NOTHING_SENT = "nothing_sent"  # armed, and the replica's body closed, failed or was empty before its first byte


# Per state, the handler of each event: payload, end, lost, client_lost, pause.
_HANDLERS: dict[RelayState, tuple[str, str, str, str, str]] = {
    RelayState.ARMED: ("_armed_payload", "_armed_end", "_armed_lost", "_gone", "_ignore"),
    RelayState.STREAMING: ("_streaming_payload", "_streaming_end", "_streaming_lost", "_gone", "_streaming_pause"),
    RelayState.PAUSED: ("_streaming_payload", "_streaming_end", "_streaming_lost", "_gone", "_ignore"),
    RelayState.ENDED: ("_ignore", "_ignore", "_ignore", "_ignore", "_ignore"),
}


class StreamRelay:
    """One streamed answer, from the replica's head to the end of the client's body.

    The replica's connection calls `payload`, `end` and `lost` (http1.client.BodyListener);
    the client's connection calls `pause` and `client_lost` (http1.messages.StreamListener). Each
    is the current state's handler (`_enter` binds them)."""

    __slots__ = (
        "payload",
        "end",
        "lost",
        "client_lost",
        "pause",
        "state",
        "stream",
        "write",
        "exchange",
        "events",
        "held",
        "usage_block",
        "first_token_pending",
        "written",
        "on_first_token",
        "on_start",
        "upstream",
        "connection",
        "ended",
        "error",
        "unsent",
        "waiter",
        "first_sent_mono",
        "open_event",
    )

    def __init__(
        self,
        upstream: ClientResponse,
        stream: Stream,
        exchange: Exchange,
        on_first_token: Callable[[int | None], None],
        on_start: Callable[[], None] | None = None,
        count_events: bool = False,
    ) -> None:
        self.upstream = upstream
        self.connection: ClientConnection = upstream.connection
        self.stream = stream
        self.write = stream.write
        self.exchange = exchange
        self.on_first_token = on_first_token  # called once with the engine's prompt token count (or None)
        self.on_start = on_start  # called once the first payload is out (the caller's "no more retries")
        # the stream's SSE events, counted where its settle needs them (module docstring); None: not counted
        self.events: EventCounter | None = EventCounter() if count_events else None
        self.held = b""  # payload after the last whole event, held until the event ends
        self.open_event = False  # an event was passed on before its end (held past MAX_HELD_BYTES)
        self.usage_block = b""
        self.first_token_pending = True
        self.written = 0  # pieces written (the first token is taken to be out by the second)
        self.ended: RelayEnd | None = None
        self.error = ""  # why the replica failed the stream (UPSTREAM_FAILED)
        self.unsent: BaseException | None = None  # NOTHING_SENT by a lost connection: what the caller retries on
        self.waiter: asyncio.Future[None] | None = None
        self.first_sent_mono: float | None = None
        self._enter(RelayState.ARMED)

    def _enter(self, state: RelayState) -> None:
        self.state = state
        names = _HANDLERS[state]
        self.payload, self.end, self.lost, self.client_lost, self.pause = (getattr(self, name) for name in names)

    async def run(self) -> RelayEnd:
        """Arm (the client's head is rendered now), take the replica's payload as it comes, and
        return once the stream has ended; between, wait for a paused client's socket to drain."""
        stream, connection = self.stream, self.connection
        stream.render_head()
        client = stream.connection
        if client.transport is None or client.transport.is_closing():
            return RelayEnd.CLIENT_GONE
        client.listener = self  # from here on its loss and back-pressure reach the relay
        connection.listener = self
        connection.deliver()  # payload that came before the relay was set up
        if connection.reader.complete:
            self.end()
        elif connection.error is not None or connection.closed:
            self.lost(connection.error)
        loop = connection.loop
        while self.state is not RelayState.ENDED:
            if self.state is RelayState.PAUSED:
                await stream.drain()  # until the client's socket takes bytes again (or is gone)
                if self.state is RelayState.PAUSED:
                    self._enter(RelayState.STREAMING)
                    connection.resume_reading()
                    if client.writing_paused:
                        self.pause()
                continue
            self.waiter = loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        assert self.ended is not None
        return self.ended

    def detach(self) -> None:
        """Stop taking the replica's and the client's events (the stream is over or being cut)."""
        if self.state is not RelayState.ENDED:
            self._enter(RelayState.ENDED)  # the caller was cancelled (a timeout, the client gone): nothing more is written
        connection = self.connection
        if connection.listener is self:
            connection.listener = None
        connection.resume_reading()  # a pooled connection reads again (to see the replica close it)
        client = self.stream.connection
        if client.listener is self:
            client.listener = None
        # the handlers are methods bound to this relay: let go of them, so that no reference cycle
        # keeps the relay (and the stream's last pieces) alive until the collector runs
        self.payload = self.end = self.lost = self.client_lost = self.pause = _nothing

    def cut(self, event: bytes) -> bytes:
        """The SSE error event that ends a stream the gateway cuts, after the events passed on."""
        return b"\n\n" + event if self.open_event else event

    # ---- ARMED ---------------------------------------------------------------------------------

    def _armed_payload(self, data: bytes) -> None:
        """The replica's first payload: out with the client's head in one write."""
        if self.exchange.expired:  # the first-token timeout has already cancelled the caller: too late
            self._end(RelayEnd.NOTHING_SENT)
            return
        self.exchange.chunks += 1
        if self.events is not None:
            self.events.feed(data)
        data = self._whole_events(data)
        if data:  # else the first event is not whole yet: still armed, nothing sent
            self._start(data)

    def _start(self, first: bytes) -> None:
        self._enter(RelayState.STREAMING)
        self._noted(first)
        self.stream.start(first)
        self.first_sent_mono = time.monotonic()
        if self.on_start is not None:
            self.on_start()
        if self.stream.connection.writing_paused:
            self.pause()

    def _armed_end(self) -> None:
        """The body ended before a whole event: empty (the caller retries), or not SSE (sent as it is)."""
        if not self.held:
            self._end(RelayEnd.NOTHING_SENT)
            return
        self._start(b"")
        self.end()

    def _armed_lost(self, error: BaseException | None) -> None:
        self.unsent = error if isinstance(error, Exception) else ServerClosed("replica closed the connection before the body")
        self._end(RelayEnd.NOTHING_SENT)

    # ---- STREAMING (and PAUSED) ----------------------------------------------------------------

    def _streaming_payload(self, data: bytes) -> None:
        """The hot path: one piece of payload from the replica, written to the client."""
        self.exchange.chunks += 1
        events = self.events
        if events is not None:
            events.feed(data)
        if self.held or self.open_event or not data.endswith(_EVENT_END):
            data = self._whole_events(data)
            if not data:
                return
        if self.first_token_pending or data.find(USAGE_KEY) >= 0:  # not `in`: see the module docstring
            self._noted(data)
        try:
            write = self.write  # a local first: CPython 3.11 cannot specialise calling a callable held in a slot
            write(data)
        except ConnectionError:
            self._end(RelayEnd.CLIENT_GONE)

    def _streaming_end(self) -> None:
        """The replica's body ended: what is held, and the end of the client's body, in one write."""
        last, self.held = self.held, b""
        if last:
            self._noted(last)
        try:
            self.stream.end(last)
        except ConnectionError:
            self._end(RelayEnd.CLIENT_GONE)
            return
        self._end(RelayEnd.COMPLETED)

    def _streaming_lost(self, error: BaseException | None) -> None:
        if error is None or isinstance(error, ServerClosed):
            self.error = "closed the connection mid-stream"
        elif isinstance(error, ClientError):
            self.error = str(error)  # what the replica sent that is not HTTP/1.1
        else:
            self.error = f"failed mid-stream ({type(error).__name__})"
        self._end(RelayEnd.UPSTREAM_FAILED)

    def _streaming_pause(self) -> None:
        self._enter(RelayState.PAUSED)
        self.connection.pause_reading()
        self._wake()  # run() waits for the client's socket to drain

    # ---- every state ---------------------------------------------------------------------------

    def _gone(self) -> None:
        self._end(RelayEnd.CLIENT_GONE)

    def _ignore(self, *_: object) -> None:
        pass

    def _end(self, reason: RelayEnd) -> None:
        self.ended = reason
        self._enter(RelayState.ENDED)
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- helpers -------------------------------------------------------------------------------

    def _whole_events(self, data: bytes) -> bytes:
        """What of the held bytes and `data` ends on an event boundary; the rest is held."""
        if self.held:
            data = self.held + data
        end = _events_end(data)
        if end == len(data):
            self.held = b""
            self.open_event = False
            return data
        if len(data) - end > MAX_HELD_BYTES:  # an event too long to hold: passed on as it is
            self.held = b""
            self.open_event = True
            return data
        self.held = data[end:]
        if end:
            self.open_event = False
        return data[:end]

    def _noted(self, data: bytes) -> None:
        """Usage and the first token, from a piece about to be written."""
        if data.find(USAGE_KEY) >= 0:
            self.usage_block = data
        if self.first_token_pending and data:
            self.written += 1
            # the regex only where the key is (a byte search is many times faster than the regex's scan)
            match = None
            at = data.find(_PROMPT_KEY)
            while at >= 0:
                match = _PROMPT_TOKENS.match(data, at)
                if match is not None:
                    break
                at = data.find(_PROMPT_KEY, at + 1)
            if match is not None or self.written > 1:  # usage in the first pieces, or this is the second
                self.first_token_pending = False
                self.on_first_token(int(match.group(1)) if match is not None else None)
