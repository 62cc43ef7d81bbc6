"""RequestRecord: one per request, the unit every metric, report and comparison reads.

A measured run (bench) and a simulated run (plan) both produce these, so every
downstream tool works on both. Times are seconds; absolute times are on the
client's monotonic-derived wall clock (`time.time()` at send, then monotonic deltas).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class RequestRecord:
    """What happened to one request, as seen by the client (or the simulator)."""

    request_id: str
    scheduled_at_s: float
    """When the load schedule wanted it sent (absolute, seconds)."""
    sent_at_s: float
    """When it was actually sent (absolute, seconds)."""
    first_token_at_s: float | None = None
    """When the first content-bearing chunk arrived."""
    finished_at_s: float | None = None
    """When the last byte arrived."""
    chunk_times_s: list[float] = field(default_factory=list)
    """Arrival time of every content-bearing chunk (absolute)."""
    chunk_tokens: list[int] = field(default_factory=list)
    """Tokens carried by each content chunk (1 per chunk unless the server batches)."""
    prompt_tokens: int | None = None
    """From the server's usage."""
    output_tokens: int | None = None
    """From the server's usage."""
    requested_prompt_tokens: int | None = None
    requested_output_tokens: int | None = None
    tokenizer_output_tokens: int | None = None
    """The client tokenizer's count of the answer text, to check usage against."""
    image_count: int = 0
    request_type: str = "text"
    """What kind of request it was, for per-type figures: text, image, multi-image, video, audio."""
    adapter: str | None = None
    """The LoRA adapter it was sent to (`bench --lora-adapters`), for per-adapter figures; None: the base model."""
    image_repeat: bool | None = None
    """True when every image in it was sent earlier in the run (a cache could serve it), False when
    at least one is new, None without images. The workload's intent, not the engine's verdict."""
    request_bytes: int | None = None
    """Size of the request body as sent."""
    upload_s: float | None = None
    """From the send (TTFT's start; a new connection's set-up included) to the request's last byte
    handed to the kernel: the client's view of the upload (bytes still in the kernel's send buffer
    are not seen)."""
    trace_id: str | None = None
    """The W3C trace id the request was sent with (`traceparent`), when engine traces were asked for:
    the engine's span of this request carries it."""
    engine_ttft_s: float | None = None
    """The engine's own time to first token (arrival in the engine to first token), when it reports it."""
    engine_queue_s: float | None = None
    """Time the request waited in the engine's scheduler queue, when the engine reports it."""
    engine_prefill_s: float | None = None
    """From first scheduled to first token (prefill, vision encoder included), when the engine reports it."""
    reasoning_tokens: int | None = None
    tool_calls: int = 0
    finish_reason: str | None = None
    """The last finish_reason the stream gave ('stop', 'length', 'tool_calls'), if any."""
    first_reasoning_at_s: float | None = None
    """When the first reasoning-bearing chunk arrived (thinking on), absolute."""
    first_answer_at_s: float | None = None
    """When the first answer-bearing chunk arrived (content or a tool call, not reasoning), absolute."""
    features: list[str] | None = None
    """The feature workloads this request carried (`--features`): tools, structured, thinking."""
    response_schema: str | None = None
    """structured: the name of the response JSON schema asked for (bench.features.catalogue)."""
    offered_tools: list[str] | None = None
    """tools: the names of the tools the request offered (bench.features.catalogue)."""
    tool_choice: str | None = None
    """tools: 'auto', 'required' or 'named' (then `named_tool` is the one asked for)."""
    named_tool: str | None = None
    answer_text: str | None = None
    """structured: the answer's content as received, kept so its validity can be checked again."""
    tool_call_text: str | None = None
    """The tool calls as received: a JSON list of {"name", "arguments"} (arguments: the raw text)."""
    schema_valid: bool | None = None
    """structured: the content parsed as JSON and validated against `response_schema`; None if not checked."""
    schema_error: str | None = None
    """Why not schema-valid, short ('not JSON: ...', 'schema: ...', 'cut at max_tokens: ...')."""
    tool_call_valid: bool | None = None
    """tools: every call names an offered tool and its arguments validate; None if not judged."""
    tool_call_error: str | None = None
    ok: bool = False
    error_kind: str | None = None
    """'http_429', 'http_500', 'timeout', 'connect', 'stream_error', ... when not ok."""
    error_message: str | None = None
    http_status: int | None = None
    workload: str = "random"
    turn_index: int = 0
    conversation_id: str | None = None
    warmup: bool = False
    simulated: bool = False
    worker: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: first content chunk − sent."""
        if self.first_token_at_s is None:
            return None
        return self.first_token_at_s - self.sent_at_s

    @property
    def e2e_s(self) -> float | None:
        """End to end: last byte − sent."""
        if self.finished_at_s is None:
            return None
        return self.finished_at_s - self.sent_at_s

    @property
    def send_lag_s(self) -> float:
        """How late the client sent it compared with its schedule."""
        return self.sent_at_s - self.scheduled_at_s

    def to_row(self) -> dict[str, object]:
        """A flat dict for Parquet/DuckDB (lists stay lists)."""
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "RequestRecord":
        names = {item.name for item in fields(cls)}
        return cls(**{key: value for key, value in row.items() if key in names})
