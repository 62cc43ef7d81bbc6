"""What the router needs to know about one request, read once from its JSON body.

The gateway has no tokenizer, so sizes are estimates (characters / chars-per-token, a fixed
count per image). They only need to be proportional to the real work for load balancing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vlmserve.gateway.openai_errors import Refusal

MAX_CLIENT_REQUEST_ID_CHARS = 128
_CLIENT_REQUEST_ID = re.compile(r"[!-~]{1,%d}" % MAX_CLIENT_REQUEST_ID_CHARS)  # printable ASCII, no spaces
MAX_SESSION_KEY_CHARS = 64
"""Longer X-Session-ID values are pinned under a digest of this length: 100,000 pins (routing/session.py)
then hold at most about 25 MB, whatever the clients send."""


OUTPUT_LIMIT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
"""The fields that bound a request's output, the first given one counting (admission checks them all)."""


class BadRequestHeader(Refusal):
    """A request header the gateway refuses (400); the message names the header and the rule."""


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's own request id (X-Request-ID, or OpenAI's X-Client-Request-ID), checked.

    It is only recorded (the audit line's `client_request_id`) and echoed (X-Client-Request-ID):
    the gateway's own id, made per request, keys every count and is what replicas see, so two
    clients choosing the same id cannot share, or corrupt, each other's accounting."""
    value = headers.get("X-Client-Request-ID") or headers.get("X-Request-ID")
    if not value:
        return None
    if not _CLIENT_REQUEST_ID.fullmatch(value):
        raise BadRequestHeader(
            400,
            f"X-Request-ID must be 1 to {MAX_CLIENT_REQUEST_ID_CHARS} printable ASCII characters "
            "without spaces (a UUID, say): drop it or send a shorter one",
            "invalid_request_id",
        )
    return value


def session_key(session_id: str | None) -> str | None:
    """What an X-Session-ID pins under: the id itself when short, else a digest of it (same id, same
    pin; the memory a pin holds is bounded whatever the id's length)."""
    if session_id is None or len(session_id) <= MAX_SESSION_KEY_CHARS:
        return session_id or None
    raw = session_id.encode("utf-8", "surrogatepass")
    return "#" + hashlib.blake2b(raw, digest_size=(MAX_SESSION_KEY_CHARS - 1) // 4).hexdigest()


@dataclass
class TokenEstimator:
    """Turns request text into approximate token counts."""

    chars_per_token: float = 4.0
    image_tokens: int = 576
    default_max_tokens: int = 256

    def text_tokens(self, chars: int) -> int:
        return max(1, int(chars / self.chars_per_token))


@dataclass(slots=True)
class RoutedRequest:
    """A request as the policies see it. Mutable only by the proxy (attempt bookkeeping)."""

    request_id: str
    model: str | None
    stream: bool
    prompt_tokens: int
    expected_output_tokens: int
    tenant: str = "anonymous"
    adapter: str | None = None  # the LoRA adapter `model` names (gateway/adapters.py); None: the base model
    priority: str = "interactive"
    session_id: str | None = None
    # Chained hashes of the chat-templated conversation, block by block.
    prefix_hashes: list[int] = field(default_factory=list)
    # The engine's own prompt token count, when its first stream chunk reports usage.
    engine_prompt_tokens: int | None = None
    # Content digests of the request's images, in order (media/preflight.py): what image-aware
    # routing keys on.
    image_digests: list[str] = field(default_factory=list)
    image_tokens: int = 0  # the images' share of prompt_tokens (estimated)
    # A stream settled from the gateway's own count of its events (relay.py's EventCounter): its
    # tenant has a token budget and the client did not ask for usage (set by app.py).
    counts_events: bool = False

    @property
    def expected_total_tokens(self) -> int:
        return self.prompt_tokens + self.expected_output_tokens


_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image_url", "input_image", "image")


def _template_messages(messages: list[Any], digests: Iterator[str] | None = None) -> tuple[str, int]:
    """Chat messages (or /v1/responses input items) as `<|role|>content`, and their image count.

    An image becomes `<image:digest>`: its content digest when the preflight computed one, else a
    digest of its URL (equal for equal inline images, as the URL holds the bytes)."""
    parts: list[str] = []
    images = 0
    for message in messages:
        if isinstance(message, str):  # /v1/responses input may mix plain strings in
            parts.append(message)
            continue
        if not isinstance(message, dict):
            continue
        parts.append(f"<|{message.get('role', '')}|>")
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for piece in content:
                if not isinstance(piece, dict):
                    continue
                kind = piece.get("type")
                if kind in _TEXT_PARTS:
                    parts.append(str(piece.get("text", "")))
                elif kind in _IMAGE_PARTS:
                    images += 1
                    digest = next(digests, None) if digests is not None else None
                    if digest is None:
                        ref = piece.get("image_url")
                        url = ref.get("url", "") if isinstance(ref, dict) else str(ref or "")
                        digest = hashlib.blake2b(url.encode("utf-8", "replace"), digest_size=8).hexdigest()
                    parts.append(f"<image:{digest}>")
    return "".join(parts), images


def _flatten_prompt(prompt: Any) -> str:
    """A completions prompt or pooling input: a string, token ids, or a list of either."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        if prompt and all(isinstance(item, int) for item in prompt):
            return " ".join(map(str, prompt))
        return "".join(str(item) for item in prompt)
    return ""


def template_conversation(body: dict[str, Any], image_digests: list[str] | None = None) -> tuple[str, int]:
    """A canonical text of the prompt and the number of images in it: the chat messages (a stand-in
    for the model's chat template: equal conversation prefixes give equal text prefixes), else the
    completions `prompt` or the /v1/responses, embeddings and pooling `input`."""
    digests = iter(image_digests) if image_digests else None
    messages = body.get("messages")
    if isinstance(messages, list):
        return _template_messages(messages, digests)
    if "prompt" in body:
        return _flatten_prompt(body["prompt"]), 0
    data = body.get("input")
    if isinstance(data, list) and any(isinstance(item, dict) for item in data):
        text, images = _template_messages(data, digests)
    else:
        text, images = _flatten_prompt(data), 0
    instructions = body.get("instructions")
    return (instructions + text if isinstance(instructions, str) else text), images


def block_hashes(text: str, block_chars: int, max_blocks: int = 512) -> list[int]:
    """Chained hashes of whole blocks of `text`: hash i covers text[: (i+1)*block_chars].

    Like vLLM's prefix-cache block hashes, a block's hash depends on everything before it, so
    matching the i-th hash means matching the whole prefix up to it. The tail shorter than a
    block is left out, as an engine cannot cache a partial block either.
    """
    hashes: list[int] = []
    previous = 0
    for start in range(0, min(len(text) // block_chars, max_blocks) * block_chars, block_chars):
        previous = hash((previous, text[start : start + block_chars]))
        hashes.append(previous)
    return hashes


def choices_of(payload: Mapping[str, object]) -> int:
    """How many answers a request asks for (`n`, checked by admission.check_output_limits; 1 when absent)."""
    n = payload.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def expected_output_tokens(body: dict[str, Any], default: int) -> int:
    """The most output tokens the request may produce: its limit (reasoning included) times its `n` choices."""
    choices = choices_of(body)
    for key in OUTPUT_LIMIT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value * choices
    return default * choices


def describe_request(
    body: dict[str, Any],
    *,
    request_id: str,
    estimator: TokenEstimator,
    prefix_block_chars: int | None,
    generates: bool = True,
    streams: bool = True,
    image_digests: list[str] | None = None,
    image_tokens: int | None = None,
) -> RoutedRequest:
    """Build the router's view of a parsed request body (a JSON object).

    `generates=False` (pooling, tokenizer routes) expects no output tokens; `streams=False`
    answers as one JSON body whatever the request's "stream" says. `image_digests` and
    `image_tokens` come from the image preflight when it ran (per-image sizes and the model's own
    token rule); without them each image counts the estimator's fixed figure.
    """
    text, images = template_conversation(body, image_digests)
    if image_tokens is None:
        image_tokens = images * estimator.image_tokens
    prompt_tokens = estimator.text_tokens(len(text)) + image_tokens
    model = body.get("model")
    return RoutedRequest(
        request_id=request_id,
        model=model if isinstance(model, str) else None,
        stream=streams and bool(body.get("stream", False)),
        prompt_tokens=prompt_tokens,
        expected_output_tokens=expected_output_tokens(body, estimator.default_max_tokens) if generates else 0,
        prefix_hashes=block_hashes(text, prefix_block_chars) if prefix_block_chars else [],
        image_digests=list(image_digests) if image_digests else [],
        image_tokens=image_tokens,
    )
