"""One in-flight request's output: OpenAI response bodies and SSE chunks, written straight to the socket.

Streaming is the hot path (thousands of chunks a second on one core), so each
request pre-encodes the bytes around a token's text once, the text of every
possible token is JSON-encoded once at import, and the engine loop writes a
ready HTTP/1.1 chunk to the transport synchronously: no coroutine, queue or
task per token. The handler coroutine only wakes when the request is done.

Backpressure: a client that reads slowly must not make the engine hold its stream in
memory. A stream is written to only while its transport holds at most
WRITE_BUFFER_HIGH_BYTES unsent; past that, its tokens wait as a count (`written` lags
`emitted`), not as bytes, and are rendered when the client has read enough, in batches
of at most WRITE_BATCH_MAX_BYTES. So one slow stream costs about the high-water mark plus
a batch plus the kernel's socket buffer, however long it is.
"""

from __future__ import annotations

import asyncio
import json
import time

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.generation import OutputPlan
from vlmserve.engines.sim.protocol import ParsedRequest
from vlmserve.engines.sim.rich_outputs import RichRenderer
from vlmserve.engines.sim.rich_plan import RichPlan
from vlmserve.json_types import JSONObject, JSONValue

_PIECE_JSON: dict[str, bytes] = {piece: json.dumps(piece).encode() for piece in tokenizer.OUTPUT_PIECES}
_PIECE_JSON_BY_INDEX: list[bytes] = [json.dumps(piece).encode() for piece in tokenizer.OUTPUT_PIECES]


def piece_json(piece: str) -> bytes:
    cached = _PIECE_JSON.get(piece)
    return cached if cached is not None else json.dumps(piece).encode()


def http_chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer frame."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_event(payload: JSONObject) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"

WRITE_BUFFER_HIGH_BYTES = 256 * 1024
"""Unsent bytes a stream's transport may hold before the engine stops writing to it."""
WRITE_BATCH_MAX_BYTES = 256 * 1024
"""Most bytes rendered for one stream in one catch-up write."""


class ActiveRequest:
    """State of one request between arrival and its last byte."""

    __slots__ = (
        "request_id", "response_id", "parsed", "plan", "created", "arrival_s", "first_token_s",
        "last_token_s", "emitted", "written", "transport", "done", "finish_reason", "aborted",
        "_prefix", "_suffix", "stall_after", "stall_duration_s", "stall_until_s", "stalled_forever", "drop_after",
        "_flush_handle", "plain", "_suffix_crlf", "_frame_base_len", "_usage_suffix", "_prompt_tokens",
        "client_request_id", "chunk_s", "chunk_tokens", "queued_s", "scheduled_s", "image_fresh", "rich",
    )  # fmt: skip

    def __init__(self, request_id: str, response_id: str, parsed: ParsedRequest, plan: OutputPlan, arrival_s: float) -> None:
        self.request_id = request_id
        self.response_id = response_id
        self.parsed = parsed
        self.plan = plan
        self.created = int(time.time())
        self.arrival_s = arrival_s
        self.queued_s = arrival_s
        """When it reached the scheduler: after the frontend (image preprocessing), as vLLM's queue time counts."""
        self.scheduled_s: float | None = None
        self.image_fresh: tuple[bool, ...] = ()
        """Per image, whether it missed the multimodal cache (the encoder must run it); empty: all did."""
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.emitted = 0
        """Tokens the engine has produced for this request."""
        self.written = 0
        """Tokens whose chunks were written to the client (lags `emitted` while stalled)."""
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.finish_reason: str | None = None
        self.aborted = False
        self.stall_after: int | None = None
        self.stall_duration_s: float | None = None
        self.stall_until_s: float | None = None
        self.stalled_forever = False
        self.drop_after: int | None = None
        self._flush_handle: asyncio.TimerHandle | None = None
        self.client_request_id: str | None = None
        """The request's X-Request-ID header, if it had one (for the emission trace)."""
        self.chunk_s: list[float] | None = None
        """Emission time of each step's tokens, kept only when the engine writes a trace."""
        self.chunk_tokens: list[int] | None = None
        self.rich: RichRenderer | None = None
        """Thinking, tools, JSON, logprobs or n>1: rendered token by token by `rich_outputs`."""
        if isinstance(plan, RichPlan) and parsed.features is not None:
            self.rich = RichRenderer(response_id, self.created, parsed, plan, parsed.features)
        model = json.dumps(parsed.model)
        if parsed.kind == "chat":
            self._prefix = (
                f'data: {{"id":"{response_id}","object":"chat.completion.chunk","created":{self.created},'
                f'"model":{model},"choices":[{{"index":0,"delta":{{"content":'
            ).encode()
            choice_end = b'},"logprobs":null,"finish_reason":null}]'
        else:
            self._prefix = (
                f'data: {{"id":"{response_id}","object":"text_completion","created":{self.created},'
                f'"model":{model},"choices":[{{"index":0,"text":'
            ).encode()
            choice_end = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]'
        self._suffix = choice_end + b"}\n\n"
        self._suffix_crlf = self._suffix + b"\r\n"
        self._frame_base_len = len(self._prefix) + len(self._suffix)
        self._prompt_tokens = len(parsed.prompt_token_ids)
        # continuous_usage_stats: the same chunk with the running counts; only the two numbers change
        self._usage_suffix = choice_end + (
            b',"usage":{"prompt_tokens":%d,"total_tokens":%%d,"completion_tokens":%%d,"prompt_tokens_details":null}}\n\n'
            % self._prompt_tokens
        )
        self.plain = False
        """True when a middle token's chunk needs no per-request decisions (the fast path)."""

    # -- streaming ---------------------------------------------------------------------------
    def attach_stream(self, transport: asyncio.Transport) -> None:
        """Stream to `transport`; call after faults are assigned (they decide the fast path)."""
        self.transport = transport
        self.plain = self.stall_after is None and self.drop_after is None and not self.plan.trimmed and self.rich is None

    def plain_frame(self, index: int) -> bytes:
        """The HTTP chunk for a middle token (not first, not last) of a plain stream."""
        piece = _PIECE_JSON_BY_INDEX[self.plan.piece_index(index)]
        if self.parsed.continuous_usage:
            return http_chunk(self._token_event(piece, index))
        return b"%x\r\n%s%s%s" % (self._frame_base_len + len(piece), self._prefix, piece, self._suffix_crlf)

    def _token_event(self, piece_json_bytes: bytes, index: int) -> bytes:
        """The SSE event of a middle token, with the running usage when the client asked for it."""
        if self.parsed.continuous_usage:
            completion_tokens = index + 1
            return (
                self._prefix
                + piece_json_bytes
                + self._usage_suffix % (self._prompt_tokens + completion_tokens, completion_tokens)
            )
        return self._prefix + piece_json_bytes + self._suffix

    def _chunk_for(self, index: int) -> bytes:
        """SSE bytes for token `index` (empty when a stop string withheld its text)."""
        if self.rich is not None:
            return self.rich.chunk(index)
        piece = self.plan.piece(index)
        data = b""
        if index == 0 and self.parsed.kind == "chat":
            data = self._role_event()
        if index == self.plan.num_tokens - 1:
            return data + self._final_events(piece)
        if not piece:
            return data
        return data + self._token_event(piece_json(piece), index)

    def write_tokens_upto(self, count: int) -> bool:
        """Write chunks for tokens [written, count) as far as backpressure allows; False if the client is gone.

        `written < count` afterwards means the client is behind (see `backlogged`).
        """
        transport = self.transport
        if transport is None:
            self.written = count
            return True
        if transport.is_closing():
            return False
        # each batch goes straight to the kernel while it takes it; the transport's own buffer
        # only grows (to the high-water mark, then no more) once the client stops reading
        while self.written < count and transport.get_write_buffer_size() <= WRITE_BUFFER_HIGH_BYTES:
            parts: list[bytes] = []
            size = 0
            index = self.written
            while index < count and size < WRITE_BATCH_MAX_BYTES:
                part = self._chunk_for(index)
                parts.append(part)
                size += len(part)
                index += 1
            self.written = index
            if size:
                data = b"".join(parts)
                transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        return True

    @property
    def backlogged(self) -> bool:
        """Tokens produced but not yet written because the client reads slowly."""
        return self.transport is not None and self.written < self.emitted

    def _role_event(self) -> bytes:
        return sse_event(self._chunk_payload({"role": "assistant", "content": ""}, None))

    def _chunk_payload(self, delta_or_text: JSONValue, finish_reason: str | None) -> JSONObject:
        if self.parsed.kind == "chat":
            choice: JSONObject = {"index": 0, "delta": delta_or_text, "logprobs": None, "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta_or_text, "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        if finish_reason is not None:
            choice["stop_reason"] = self.plan.stop_reason
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.parsed.model, "choices": [choice]}

    def _event_with_usage(self, piece: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        delta: JSONValue = {"content": piece} if self.parsed.kind == "chat" else piece
        payload = self._chunk_payload(delta, finish_reason)
        payload["usage"] = self.usage(completion_tokens)
        return sse_event(payload)

    def _final_events(self, piece: str) -> bytes:
        """Last token (with finish_reason), optional usage chunk, then [DONE]."""
        reason = self.plan.finish_reason
        if self.parsed.continuous_usage:
            events = [self._event_with_usage(piece, reason, self.plan.num_tokens)]
        else:
            delta: JSONValue = ({"content": piece} if piece else {}) if self.parsed.kind == "chat" else piece
            events = [sse_event(self._chunk_payload(delta, reason))]
        if self.parsed.include_usage:
            events.append(
                sse_event(
                    {
                        "id": self.response_id,
                        "object": "chat.completion.chunk" if self.parsed.kind == "chat" else "text_completion",
                        "created": self.created,
                        "model": self.parsed.model,
                        "choices": [],
                        # vLLM drops null fields from this chunk (exclude_none)
                        "usage": {k: v for k, v in self.usage(self.plan.num_tokens).items() if v is not None},
                    }
                )
            )
        events.append(SSE_DONE)
        return b"".join(events)

    # -- whole responses ---------------------------------------------------------------------
    def usage(self, completion_tokens: int) -> JSONObject:
        prompt_tokens = len(self.parsed.prompt_token_ids)
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }

    def response_body(self) -> JSONObject:
        """The non-streaming JSON body, as vLLM returns it."""
        if self.rich is not None:
            return self.rich.body()
        text = self.plan.text
        if self.parsed.kind == "chat":
            choice: JSONObject = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": [], "reasoning_content": None},
                "logprobs": None,
                "finish_reason": self.plan.finish_reason,
                "stop_reason": self.plan.stop_reason,
            }
            obj = "chat.completion"
        else:
            if self.parsed.echo_prompt is not None:
                text = self.parsed.echo_prompt + text
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": self.plan.finish_reason,
                "stop_reason": self.plan.stop_reason,
            }
            obj = "text_completion"
        return {
            "id": self.response_id,
            "object": obj,
            "created": self.created,
            "model": self.parsed.model,
            "choices": [choice],
            "usage": self.usage(self.plan.num_tokens),
        }

    def resolve(self, outcome: str) -> None:
        """Wake the handler: 'finished', 'aborted' or 'dropped'."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self.done.done():
            self.done.set_result(outcome)
