"""One streamed request in, one RequestRecord out: the timing-critical path of the bench.

Kept lean on purpose (it runs thousands of times a second in each worker): the body is
serialised before the clock starts, the stream is read in whatever pieces the socket
delivers, and only token-bearing chunks count: answer text, reasoning text or tool calls,
or (with per-chunk counts) a chunk whose token count grew although its text is empty. Per-chunk token counts come from `stream_options.continuous_usage_stats`
where the server offers it (vLLM does), otherwise each chunk counts one token and the
usage total is spread over the chunks at the end.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from vlmserve.bench.http_stream import ConnectionLost, ConnectionPool, HttpProtocolError, post_stream
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.results.records import RequestRecord

_loads = json.loads


@dataclass
class RequestOptions:
    """How every request of a run is shaped (fixed for the run)."""

    api: str = "chat"
    model: str = ""
    ignore_eos: bool = True
    per_chunk_usage: bool = True
    extra_body: JSONObject = field(default_factory=dict)
    mm_processor_kwargs: JSONObject | None = None

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"


def build_body(
    options: RequestOptions, max_tokens: int, *, messages: list[JSONObject] | None = None, prompt: str | None = None
) -> JSONObject:
    """The JSON body of one streamed request; `--extra-body` is merged last and wins."""
    stream_options: JSONObject = {"include_usage": True}
    if options.per_chunk_usage:
        stream_options["continuous_usage_stats"] = True
    body: JSONObject = {"model": options.model, "stream": True, "stream_options": stream_options, "max_tokens": max_tokens}
    if options.api == "chat":
        body["messages"] = [*(messages or [])]
    else:
        body["prompt"] = prompt or ""
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.mm_processor_kwargs:
        body["mm_processor_kwargs"] = options.mm_processor_kwargs
    body.update(options.extra_body)
    return body


def encode_body(body: JSONObject) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _error_text(payload: bytes) -> str:
    """The server's error message from an OpenAI-format error body, else the raw start."""
    try:
        data = _loads(payload)
        error = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(error, dict):
            return str(error.get("message") or error)[:300]
        return str(error)[:300]
    except ValueError:
        return payload[:300].decode("utf-8", "replace")


ToolCallKey = str | int | float | bool | None
"""What identifies a tool call across stream chunks: its `index` (or `id`), a JSON scalar."""


@dataclass
class _ToolCall:
    """One tool call as its deltas arrive: the name (sent once) and the argument text in pieces."""

    name: str | None = None
    pieces: list[str] = field(default_factory=list)


class _StreamState:
    """What one SSE stream has told us so far."""

    __slots__ = (
        "first",
        "times",
        "tokens",
        "parts",
        "usage",
        "last_completion",
        "tool_ids",
        "reasoning_chunks",
        "reasoning_tokens",
        "per_chunk",
        "done",
        "error",
        "offset",
        "first_reasoning",
        "first_answer",
        "finish_reason",
        "tool_parts",
    )

    def __init__(self, keep_text: bool, offset: float = 0.0) -> None:
        self.offset = offset
        """Added to perf_counter times to give wall-clock seconds."""
        self.first: float | None = None
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.parts: list[str] | None = [] if keep_text else None
        self.usage: JSONObject | None = None
        self.last_completion = 0
        self.tool_ids: set[ToolCallKey] = set()
        self.reasoning_chunks = 0
        self.reasoning_tokens = 0
        self.per_chunk = False
        self.done = False
        self.error: str | None = None
        self.first_reasoning: float | None = None
        self.first_answer: float | None = None
        self.finish_reason: str | None = None
        self.tool_parts: dict[ToolCallKey, _ToolCall] | None = None
        """Tool calls by index (only streams that carry tool calls fill it)."""

    def event(self, data: bytes, now: float) -> None:
        """Fold one SSE `data:` payload into the state.

        The per-chunk hot path: a content chunk runs straight through without helper calls;
        the rare cases (end, broken or error events, reasoning, tool calls) go to helpers.
        """
        if data == b"[DONE]":
            self.done = True
            return
        try:
            message = _loads(data)
        except ValueError:
            self._unparseable(data)
            return
        if "error" in message or message.get("object") == "error":
            self.error = _error_text(data)
            return
        usage = message.get("usage")
        completion_now = self.last_completion
        reported = False
        if usage:
            self.usage = usage
            tokens = usage.get("completion_tokens")
            if tokens is not None:
                completion_now = int(tokens)
                reported = True
        choices = message.get("choices")
        carried = answer = False
        reasoning = None
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta is None:  # the completions API: text on the choice itself
                text = choice.get("text")
                tool_calls = None
            else:
                text = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                tool_calls = delta.get("tool_calls")
                if tool_calls:
                    self._tool_calls(tool_calls)
            answer = bool(text or tool_calls)
            carried = answer or bool(reasoning)
            if text and self.parts is not None:
                self.parts.append(text)
            finish = choice.get("finish_reason")
            if finish:
                self.finish_reason = finish
            if reported:
                self.per_chunk = True
                # a token whose text is still held back (a partial UTF-8 character, a special
                # token) arrives with empty text: with per-chunk counts it still is a token
                carried = carried or completion_now > self.last_completion
        if carried:
            now += self.offset
            if self.first_answer is None:  # only until the first answer chunk
                self._first_times(now, answer)
            self.times.append(now)
            self.tokens.append(max(completion_now - self.last_completion, 1) if self.per_chunk else 1)
            if reasoning:
                self._reasoning_chunk(now)
            # tokens reported on chunks without content (held-back text) go to the next content chunk
            self.last_completion = completion_now

    def _unparseable(self, data: bytes) -> None:
        """A payload that is not JSON fails the request, quoting its start for the reader."""
        self.error = f"unparseable stream event: {data[:80]!r}"

    def _first_times(self, now: float, answer: bool) -> None:
        """Note the first token-bearing chunk and the first answer chunk (once each per stream)."""
        if self.first is None:
            self.first = now
        if answer:
            self.first_answer = now

    def _reasoning_chunk(self, now: float) -> None:
        """Count a reasoning-bearing chunk (just appended to the timeline) and its tokens."""
        self.reasoning_chunks += 1
        self.reasoning_tokens += self.tokens[-1]
        if self.first_reasoning is None:
            self.first_reasoning = now

    def _tool_calls(self, tool_calls: list[JSONValue]) -> None:
        """Accumulate a chunk's tool-call deltas (rare: only tool-using streams carry them)."""
        for call in tool_calls:
            self._tool_piece(call)

    def _tool_piece(self, call: JSONValue) -> None:
        """Accumulate one tool-call delta: the name comes once, the arguments in pieces (OpenAI's stream format)."""
        if not isinstance(call, dict):
            return  # not a tool-call delta: nothing to accumulate (the answer will not validate)
        given = call.get("index", call.get("id"))
        key = json.dumps(given) if isinstance(given, (list, dict)) else given  # a set holds no list or object
        self.tool_ids.add(key)
        if self.tool_parts is None:
            self.tool_parts = {}
        entry = self.tool_parts.setdefault(key, _ToolCall())
        function = call.get("function")
        if not isinstance(function, dict):
            return
        name, arguments = function.get("name"), function.get("arguments")
        if name:
            entry.name = str(name)
        if arguments:  # text pieces by the standard; an object sent whole is kept as its JSON
            entry.pieces.append(arguments if isinstance(arguments, str) else json.dumps(arguments))

    def tool_call_text(self) -> str | None:
        """The calls as one JSON list of {"name", "arguments"} (arguments the raw text), or None without calls."""
        if not self.tool_parts:
            return None
        return json.dumps([{"name": call.name, "arguments": "".join(call.pieces)} for call in self.tool_parts.values()])


class _SSELines:
    """Splits decoded body pieces into SSE `data:` events for the stream state."""

    __slots__ = ("state", "buffer")

    def __init__(self, state: _StreamState) -> None:
        self.state = state
        self.buffer = b""

    def feed(self, piece: bytes, now: float) -> None:
        if b"\n" not in piece:
            self.buffer += piece
            return
        lines = (self.buffer + piece).split(b"\n") if self.buffer else piece.split(b"\n")
        self.buffer = lines.pop()
        event = self.state.event
        for line in lines:
            if line.startswith(b"data:"):
                event(line[5:].strip(), now)

    def close(self, now: float) -> None:
        if self.buffer.startswith(b"data:"):
            self.state.event(self.buffer[5:].strip(), now)
        self.buffer = b""


async def stream_request(
    pool: ConnectionPool,
    body: bytes,
    record: RequestRecord,
    *,
    clock_offset: float,
    timeout_s: float,
    keep_text: bool = False,
    extra_headers: bytes = b"",
) -> str | None:
    """Send one streamed request and fill `record` in place; returns the answer text if kept.

    `record.upload_s` runs from the send (the TTFT clock's start, so a new connection's set-up
    counts) to the request's last byte being handed to the kernel: what the client can see of
    the upload. `extra_headers` are this request's own header lines (a traceparent).

    Times are `time.perf_counter()` (CLOCK_MONOTONIC, shared by all worker processes)
    plus `clock_offset`, giving wall-clock seconds comparable across workers. A chunk's
    time is when the read that brought it returned.
    """
    perf = time.perf_counter
    state = _StreamState(keep_text, clock_offset)
    lines = _SSELines(state)
    record.request_bytes = len(body)
    started = perf()
    record.sent_at_s = started + clock_offset
    try:
        async with asyncio.timeout(timeout_s):
            response = await post_stream(pool, body, lines.feed, extra_headers)
        record.http_status = response.status
        if response.written_at is not None:
            record.upload_s = max(response.written_at - started, 0.0)
        record.finished_at_s = perf() + clock_offset
        if response.status != 200:
            record.error_kind = f"http_{response.status}"
            record.error_message = _error_text(bytes(response.error_body))
            return None
        lines.close(perf())
    except TimeoutError:
        record.finished_at_s = perf() + clock_offset
        record.error_kind, record.error_message = "timeout", f"no complete answer within {timeout_s:g} s"
    except HttpProtocolError as err:  # before ConnectionLost, which it is a kind of
        record.finished_at_s = perf() + clock_offset
        record.error_kind, record.error_message = "protocol_error", str(err)[:300]
    except ConnectionLost as err:
        record.finished_at_s = perf() + clock_offset
        record.error_kind, record.error_message = "disconnected", str(err)[:300]
    except OSError as err:  # refused, unreachable, name resolution, TLS handshake
        record.finished_at_s = perf() + clock_offset
        record.error_kind, record.error_message = "connect", f"{type(err).__name__}: {err}"[:300]
    except asyncio.CancelledError:  # the run was stopped (Ctrl-C): keep what this request got
        record.finished_at_s = perf() + clock_offset
        record.error_kind, record.error_message = "interrupted", "the run was stopped before the answer ended"
        _finish(record, state)
        raise
    _finish(record, state)
    return "".join(state.parts) if state.parts is not None else None


def _token_count(value: JSONValue) -> int | None:
    """A usage count as the server sent it (an integer); None when absent or not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finish(record: RequestRecord, state: _StreamState) -> None:
    """Copy the stream's findings into the record and decide ok / error cause."""
    record.first_token_at_s = state.first
    record.chunk_times_s = state.times
    record.chunk_tokens = state.tokens
    usage = state.usage or {}
    if usage:
        record.prompt_tokens = _token_count(usage.get("prompt_tokens"))
        record.output_tokens = _token_count(usage.get("completion_tokens"))
        details = usage.get("completion_tokens_details")
        reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
        if isinstance(reasoning, (int, float, str)):
            record.reasoning_tokens = int(reasoning)
    if record.reasoning_tokens is None and state.reasoning_chunks:
        record.reasoning_tokens = state.reasoning_tokens
    record.tool_calls = len(state.tool_ids)
    record.first_reasoning_at_s = state.first_reasoning
    record.first_answer_at_s = state.first_answer
    record.finish_reason = state.finish_reason
    record.tool_call_text = state.tool_call_text()
    if record.output_tokens and state.tokens:
        if not state.per_chunk:
            _spread_tokens(state.tokens, record.output_tokens)
        elif record.output_tokens > sum(state.tokens):
            # tokens whose text never appeared in a content chunk belong to the last one
            state.tokens[-1] += record.output_tokens - sum(state.tokens)
    if record.error_kind is not None:
        return
    if state.error is not None:
        record.error_kind, record.error_message = "stream_error", state.error
    elif not state.done:
        record.error_kind, record.error_message = "incomplete_stream", "the stream ended without [DONE]"
    elif state.first is None and not record.output_tokens:
        record.error_kind, record.error_message = "empty_answer", "the answer had no content"
    else:
        record.ok = True


def _spread_tokens(tokens: list[int], total: int) -> None:
    """Without per-chunk counts, spread usage's total over the chunks (extra tokens evenly)."""
    chunks = len(tokens)
    if total <= chunks:
        return
    base, extra = divmod(total, chunks)
    for index in range(chunks):
        tokens[index] = base + (1 if index < extra else 0)
