"""Parse and validate OpenAI-style request bodies the way vLLM's server does.

Every problem becomes an ApiError carrying vLLM's status code, error type and (where
vLLM has one) its wording, so clients and gateways see the same errors from the sim
engine as from a real vLLM (checked against vLLM 0.32's entrypoints):
- unknown model → 404 NotFoundError "The model `X` does not exist."
- prompt longer than max_model_len → 400 "This model's maximum context length is ..."
- max_tokens above max_model_len → 400 "max_tokens=N cannot be greater than max_model_len=M ..."
- prompt + max_tokens above max_model_len → max_tokens is clamped (as vLLM 0.32 does), or,
  with `--reject-over-context`, 400 in the wording of earlier vLLM releases ("... you requested
  N tokens (P in the messages, M in the completion) ...").

The body itself must be valid Unicode: strict UTF-8 bytes, and no lone UTF-16 surrogate
from a `\ud800`-style escape (Python's json accepts both, and the first `str.encode()`
downstream would fail as a 500). Either is a 400 like any other bad body.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PIL import Image

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.options import SimEngineConfig
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.vision.tokens import ImageTokenEstimator

if TYPE_CHECKING:
    from vlmserve.engines.sim.features import Features


class ApiError(Exception):
    """An error answered in OpenAI format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> JSONObject:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""An escape that may encode half of a surrogate pair: only bodies with one are walked."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_json_body(raw: bytes) -> JSONValue:
    """The request body as JSON; a 400 ApiError for bytes that are not valid UTF-8 JSON text."""
    try:
        text = raw.decode("utf-8")  # strict: invalid bytes and encoded surrogates are refused
    except UnicodeDecodeError as err:
        raise bad_request(f"the request body is not valid UTF-8 (byte {err.start}); send UTF-8 encoded JSON") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text) and _holds_lone_surrogate(body):
        raise bad_request(
            "the request body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); send valid Unicode text"
        )
    return body


def _holds_lone_surrogate(value: JSONValue) -> bool:
    """True if any string (key or value) in the decoded JSON holds an unpaired surrogate."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


@dataclass
class ParsedRequest:
    """A validated generation request, reduced to what the engine needs."""

    kind: str  # "chat" or "completion"
    model: str
    prompt_token_ids: list[int]
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    temperature: float | None = None
    """None: not given (vLLM's default, sampling)."""
    images: int = 0
    image_tokens: int = 0
    echo_prompt: str | None = None
    image_items: list[tuple[int, int]] = field(default_factory=list)
    """(digest, pixels) of each image, for the frontend model (sched.frontend)."""
    image_positions: list[tuple[int, int]] = field(default_factory=list)
    """(offset, length) of each image's placeholder tokens in prompt_token_ids, aligned with image_items:
    where the scheduler's prefill reaches the image and must encode it (sched.encoder_cache_manager)."""
    features: Features | None = None
    """Thinking, tools, structured output, logprobs, n (features.parse_features); None: plain text."""


# -- small typed getters ---------------------------------------------------------------------
def _get_bool(body: JSONObject, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean, got {type(value).__name__}", name)
    return value


def _get_int(body: JSONObject, name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {value!r}", name)
    if value < minimum:
        raise bad_request(f"'{name}' must be at least {minimum}, got {value}", name)
    return value


def _get_temperature(body: JSONObject) -> float | None:
    value = body.get("temperature")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise bad_request(f"'temperature' must be a number >= 0, got {value!r}", "temperature")
    return float(value)


def _get_stop(body: JSONObject) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        return [item for item in stop if isinstance(item, str) and item]
    raise bad_request("'stop' must be a string or a list of strings", "stop")


# -- images ----------------------------------------------------------------------------------
UNKNOWN_IMAGE_SIDE = 1000
"""Side assumed for an image behind an http(s) URL (the sim engine never fetches it): 1 MP."""


class ImageValidator:
    """Checks image_url parts (data URLs are decoded with PIL) and remembers recent verdicts."""

    def __init__(self, capacity: int = 256, estimator: ImageTokenEstimator | None = None) -> None:
        self._verdicts: OrderedDict[str, tuple[int, int, int]] = OrderedDict()
        self._capacity = capacity
        self.estimator = estimator
        """The model's own image token rule (vision.tokens); None: the engine's fixed --image-tokens."""

    def digest(self, url: str) -> int:
        """A stable 64-bit digest of a valid image URL; raises ApiError for a bad one."""
        return self.inspect(url)[0]

    def tokens(self, width: int, height: int, chosen_budget: int | None, default: int) -> int:
        """Vision tokens of one image: the request's budget, else the model's rule, else `default`."""
        if chosen_budget is not None:
            return chosen_budget
        return self.estimator.tokens(width, height) if self.estimator is not None else default

    def inspect(self, url: str) -> tuple[int, int, int]:
        """(digest, width, height) of a valid image URL; raises ApiError for a bad one."""
        key = hashlib.blake2b(url.encode(), digest_size=8).hexdigest()
        cached = self._verdicts.get(key)
        if cached is not None:
            self._verdicts.move_to_end(key)
            return cached
        if url.startswith("data:"):
            width, height = _check_data_url(url)
        elif url.startswith(("http://", "https://")):
            width = height = UNKNOWN_IMAGE_SIDE
        else:
            raise bad_request("image_url must be an http(s) URL or a base64 data URL (data:image/...;base64,...)", "messages")
        verdict = (int(key, 16), width, height)
        self._verdicts[key] = verdict
        if len(self._verdicts) > self._capacity:
            self._verdicts.popitem(last=False)
        return verdict


def _check_data_url(url: str) -> tuple[int, int]:
    """The image's (width, height); ApiError unless the data URL holds a readable image."""
    header, _sep, payload = url.partition(",")
    if not _sep or ";base64" not in header:
        raise bad_request("image data URL must look like data:image/png;base64,<data>", "messages")
    try:
        raw = base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError):
        raise bad_request("image data URL does not hold valid base64", "messages") from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            width, height = image.size
            image.verify()
    except Exception:  # PIL raises many types for non-images
        raise bad_request("the image_url part does not hold a readable image (PIL could not decode it)", "messages") from None
    return width, height


# -- prompts ---------------------------------------------------------------------------------
def _image_budget(body: JSONObject, config: SimEngineConfig) -> int | None:
    """A budget the request picked via mm_processor_kwargs (checked), or None."""
    kwargs = body.get("mm_processor_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise bad_request("'mm_processor_kwargs' must be an object", "mm_processor_kwargs")
    nested = kwargs.get("images_kwargs")
    images_kwargs: JSONObject = nested if isinstance(nested, dict) else {}
    budget = kwargs.get("max_soft_tokens", images_kwargs.get("max_soft_tokens", kwargs.get("image_tokens")))
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise bad_request("mm_processor_kwargs.max_soft_tokens must be a positive integer", "mm_processor_kwargs")
    if config.allowed_image_budgets and budget not in config.allowed_image_budgets:
        allowed = ", ".join(str(value) for value in config.allowed_image_budgets)
        raise bad_request(f"max_soft_tokens={budget} is not supported; choose one of {allowed}", "mm_processor_kwargs")
    return budget


def _chat_prompt(
    body: JSONObject,
    config: SimEngineConfig,
    images: ImageValidator,
    items: list[tuple[int, int]],
    positions: list[tuple[int, int]],
) -> tuple[list[int], int, int]:
    """Token ids of the rendered chat (role headers + content + image placeholders)."""
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required: a list of {role, content} objects", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects", "messages")
    budget = _image_budget(body, config)
    token_ids: list[int] = []
    image_tokens = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{index}] must be an object with a string 'role'", "messages")
        token_ids += tokenizer.encode(f"<|{message['role']}|>\n")
        content = message.get("content")
        if content is None:
            pass
        elif isinstance(content, str):
            token_ids += tokenizer.encode(content)
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                image_tokens += _add_content_part(
                    part, index, part_index, budget, config.image_tokens, images, token_ids, items, positions
                )
        else:
            raise bad_request(f"messages[{index}].content must be a string or a list of parts", "messages")
        token_ids += tokenizer.encode("\n")
    if body.get("add_generation_prompt", True):
        token_ids += tokenizer.encode("<|assistant|>\n")
    return token_ids, len(items), image_tokens


def _add_content_part(
    part: JSONValue,
    index: int,
    part_index: int,
    budget: int | None,
    default_tokens: int,
    images: ImageValidator,
    token_ids: list[int],
    items: list[tuple[int, int]],
    positions: list[tuple[int, int]],
) -> int:
    """Append one content part's tokens; returns the image's vision tokens (0 for text)."""
    where = f"messages[{index}].content[{part_index}]"
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise bad_request(f"{where} must be an object with a 'type'", "messages")
    part_type = part["type"]
    if part_type == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"{where}.text must be a string", "messages")
        token_ids += tokenizer.encode(text)
        return 0
    if part_type == "image_url":
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str) or not url:
            raise bad_request(f"{where}.image_url.url must be a non-empty string", "messages")
        digest, width, height = images.inspect(url)
        items.append((digest, width * height))
        count = images.tokens(width, height, budget, default_tokens)
        positions.append((len(token_ids), count))
        token_ids += tokenizer.image_token_ids(digest, count)
        return count
    raise bad_request(f"{where} has unsupported type '{part_type}'; use 'text' or 'image_url'", "messages")


def _completion_prompt(body: JSONObject) -> tuple[list[int], str | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("'prompt' is required: a string or a list of token ids", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), prompt
    if isinstance(prompt, list) and prompt and all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
        return [item for item in prompt if isinstance(item, int)], None  # every item is (checked above)
    raise bad_request("'prompt' must be one string or one list of token ids (batches are not supported)", "prompt")


# -- the whole request -----------------------------------------------------------------------
def parse_generation_request(body: object, kind: str, config: SimEngineConfig, images: ImageValidator) -> ParsedRequest:
    """Validate a /v1/chat/completions (kind='chat') or /v1/completions body."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = _served_model(body, config)
    if kind == "chat":
        image_items: list[tuple[int, int]] = []
        image_positions: list[tuple[int, int]] = []
        prompt_token_ids, num_images, image_tokens = _chat_prompt(body, config, images, image_items, image_positions)
        echo_prompt = None
        limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        prompt_token_ids, echo_prompt = _completion_prompt(body)
        num_images, image_tokens, image_items, image_positions = 0, 0, [], []
        limit_name = "max_tokens"
    if not prompt_token_ids:
        raise bad_request("the prompt is empty", "prompt" if kind != "chat" else "messages")
    max_tokens, min_tokens = _output_limits(body, kind, config, len(prompt_token_ids), limit_name)
    stream = _get_bool(body, "stream")
    stream_options = _stream_options(body, stream)
    return ParsedRequest(
        kind=kind,
        model=model,
        prompt_token_ids=prompt_token_ids,
        stream=stream,
        include_usage=_get_bool(stream_options, "include_usage"),
        continuous_usage=_get_bool(stream_options, "continuous_usage_stats"),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_get_bool(body, "ignore_eos"),
        stop=_get_stop(body),
        seed=_get_int(body, "seed", -(2**63)),
        temperature=_get_temperature(body),
        images=num_images,
        image_tokens=image_tokens,
        echo_prompt=echo_prompt if _get_bool(body, "echo") else None,
        image_items=image_items,
        image_positions=image_positions,
    )


def _served_model(body: JSONObject, config: SimEngineConfig) -> str:
    """The request's model: the first served name when absent; 404 for one this engine does not serve."""
    model = body.get("model")
    if model is None:
        return config.model_names[0]
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model not in config.model_names and model not in config.lora_modules:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    return model


def _output_limits(body: JSONObject, kind: str, config: SimEngineConfig, prompt_len: int, limit_name: str) -> tuple[int, int]:
    """(max_tokens, min_tokens) within the context, refused with vLLM's own messages where vLLM refuses."""
    max_model_len = config.max_model_len
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains {prompt_len} input tokens, which exceeds this limit even without any output "
            "tokens. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    requested = _get_int(body, limit_name, 1)
    if requested is not None and requested > max_model_len:
        raise bad_request(
            f"{limit_name}={requested} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens.",
            limit_name,
        )
    if requested is not None and prompt_len + requested > max_model_len and config.reject_over_context:
        kind_word = "messages" if kind == "chat" else "prompt"
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the {kind_word}, {requested} in the completion). "
            f"Please reduce the length of the {kind_word} or completion.",
            limit_name,
        )
    max_tokens = max_model_len - prompt_len if requested is None else min(requested, max_model_len - prompt_len)
    min_tokens = _get_int(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens and requested is not None:
        raise bad_request(f"min_tokens={min_tokens} must be less than or equal to max_tokens={max_tokens}", "min_tokens")
    return max_tokens, min(min_tokens, max_tokens)


def _stream_options(body: JSONObject, stream: bool) -> JSONObject:
    """`stream_options`, an object and only with `stream=True` (as vLLM checks it)."""
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    stream_options = stream_options or {}
    if stream_options and not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    return stream_options
