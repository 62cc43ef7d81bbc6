"""Parse the request options a VLM product uses beyond plain text: thinking, tools, structured
output, logprobs and n>1 (vLLM's wire format), and refuse what the sim engine cannot honour.

Why a module of its own: these options change *what* is generated (reasoning text, a tool
call, schema-valid JSON, several choices) but not how requests are scheduled, so they are
parsed once here into `Features` and used by `rich_plan` (the tokens) and `rich_outputs`
(the bytes). Anything the engine would otherwise silently drop — an unknown response_format
type, a tool with a schema it cannot satisfy, a tool_choice naming an unknown function,
best_of, beam search, regex or grammar constraints — is a 400 in OpenAI format, so a client
never mistakes free text for an honoured constraint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from vlmserve.engines.sim.protocol import bad_request
from vlmserve.engines.sim.schema_values import SchemaError, minimal_value
from vlmserve.json_types import JSONObject, JSONValue

MAX_N = 16
"""Most choices per request (vLLM has no fixed limit; the sim keeps requests bounded)."""
MAX_LOGPROBS = 20
"""vLLM's default `--max-logprobs`."""
REASONING_EFFORTS = {"none": 0.0, "minimal": 0.25, "low": 0.5, "medium": 1.0, "high": 2.0, "xhigh": 3.0, "max": 4.0}
"""reasoning_effort → multiplier on the drawn reasoning length ("none" turns thinking off)."""
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_REFUSED = {
    "best_of": "'best_of' is not supported by the sim engine (vLLM removed it in V1); use n",
    "use_beam_search": "beam search is not supported by the sim engine",
    "prompt_logprobs": "'prompt_logprobs' is not supported by the sim engine",
    "functions": "the legacy 'functions' field is not supported; use 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; use 'tool_choice'",
    "guided_regex": "regex-constrained output ('guided_regex') is not supported by the sim engine",
    "guided_grammar": "grammar-constrained output ('guided_grammar') is not supported by the sim engine",
    "guided_choice": "choice-constrained output ('guided_choice') is not supported by the sim engine",
}


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: JSONObject
    arguments: str
    """The call's arguments: the minimal valid JSON for `parameters`, rendered once at parse time."""


@dataclass
class Features:
    """What the answer looks like beyond plain text (defaults: plain text, one choice)."""

    n: int = 1
    thinking: bool = False
    reasoning_scale: float = 1.0
    include_reasoning: bool = True
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "none"
    """'none', 'auto', 'required', or 'named' (then `named_tool` is the one)."""
    named_tool: Tool | None = None
    json_text: str | None = None
    """The structured answer (schema-valid JSON text), when response_format asks for JSON."""
    logprobs: bool = False
    top_logprobs: int = 0

    @property
    def rich(self) -> bool:
        """True when the answer needs the general renderer (anything but one plain-text choice)."""
        return (self.n != 1 or self.thinking or self.tool_choice != "none" or self.json_text is not None
                or self.logprobs)  # fmt: skip

    @property
    def forces_tool_call(self) -> bool:
        return self.tool_choice in ("required", "named")


def parse_features(body: JSONObject, kind: str) -> Features:
    """The feature options of a chat (kind='chat') or completion body; ApiError for what cannot be honoured."""
    for name, message in _REFUSED.items():
        if _asks_for(body.get(name), allowed_int=1 if name == "best_of" else 0):
            raise bad_request(message, name)
    features = Features()
    features.n = _int_option(body, "n", 1, MAX_N, f"n must be between 1 and {MAX_N} in the sim engine") or 1
    if kind == "chat":
        _chat_logprobs(body, features)
        _thinking(body, features)
        _tools(body, features)
    else:
        for name in ("tools", "tool_choice", "chat_template_kwargs", "reasoning_effort"):
            if body.get(name) is not None:
                raise bad_request(f"'{name}' applies to /v1/chat/completions only", name)
        _completion_logprobs(body, features)
    features.json_text = _structured_output(body)
    if features.json_text is not None and features.forces_tool_call:
        raise bad_request("response_format/structured_outputs cannot be combined with a forced tool_choice", "response_format")
    return features


def _asks_for(value: JSONValue, allowed_int: int) -> bool:
    """True if `value` actually requests the option (None, false, or an integer up to `allowed_int` do not)."""
    if value is None or value is False:
        return False
    if isinstance(value, int) and not isinstance(value, bool) and value <= allowed_int:
        return False
    return True


def _int_option(body: JSONObject, name: str, low: int, high: int, message: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {value!r}", name)
    if not low <= value <= high:
        raise bad_request(message, name)
    return value


def _chat_logprobs(body: JSONObject, features: Features) -> None:
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request("'logprobs' must be a boolean in chat completions", "logprobs")
    top = _int_option(body, "top_logprobs", 0, 10**9, "'top_logprobs' must be non-negative")
    if top is not None and top > MAX_LOGPROBS:
        raise bad_request(f"top_logprobs={top} is above the maximum of {MAX_LOGPROBS} (--max-logprobs)", "top_logprobs")
    if top and not logprobs:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    features.logprobs = bool(logprobs)
    features.top_logprobs = top or 0


def _completion_logprobs(body: JSONObject, features: Features) -> None:
    value = body.get("logprobs")
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request("'logprobs' must be a non-negative integer in completions", "logprobs")
    if value > MAX_LOGPROBS:
        raise bad_request(f"logprobs={value} is above the maximum of {MAX_LOGPROBS} (--max-logprobs)", "logprobs")
    features.logprobs = True
    features.top_logprobs = value


def _thinking(body: JSONObject, features: Features) -> None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    enable = (kwargs or {}).get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise bad_request("chat_template_kwargs.enable_thinking must be a boolean", "chat_template_kwargs")
    effort = body.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str) or effort not in REASONING_EFFORTS:
            raise bad_request(
                f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}", "reasoning_effort"
            )
        features.reasoning_scale = REASONING_EFFORTS[effort] or 1.0
    # vLLM: reasoning_effort turns thinking on (off for "none") unless enable_thinking says otherwise
    features.thinking = enable if enable is not None else (effort is not None and effort != "none")
    include = body.get("include_reasoning", True)
    if not isinstance(include, bool):
        raise bad_request("'include_reasoning' must be a boolean", "include_reasoning")
    features.include_reasoning = include


def _tools(body: JSONObject, features: Features) -> None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise bad_request("when using `tool_choice`, `tools` must be set", "tool_choice")
        return
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of {type: 'function', function: {...}} objects", "tools")
    by_name: dict[str, Tool] = {}
    for index, tool in enumerate(tools):
        parsed = _tool(tool, index)
        if parsed.name in by_name:
            raise bad_request(f"tools[{index}]: the function name '{parsed.name}' is used twice", "tools")
        by_name[parsed.name] = parsed
    features.tools = list(by_name.values())
    if choice is None or choice in ("auto", "none", "required"):
        features.tool_choice = choice or "auto"
        return
    if isinstance(choice, str):
        raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}", "tool_choice")
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request("a named tool_choice must look like {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    if name not in by_name:
        raise bad_request(f"tool_choice names the function '{name}', which is not in `tools`", "tool_choice")
    features.tool_choice = "named"
    features.named_tool = by_name[name]


def _tool(tool: JSONValue, index: int) -> Tool:
    where = f"tools[{index}]"
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
        raise bad_request(f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise bad_request(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}", "tools")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON Schema object", "tools")
    if parameters.get("type", "object") != "object":
        raise bad_request(f"{where}.function.parameters must describe an object (type 'object')", "tools")
    try:
        arguments = _json_text(minimal_value(parameters))
    except SchemaError as err:
        raise bad_request(f"{where}.function.parameters is not a schema the sim engine can satisfy: {err}", "tools") from None
    return Tool(name=name, parameters=parameters, arguments=arguments)


def _structured_output(body: JSONObject) -> str | None:
    """The JSON answer asked for by response_format, structured_outputs or guided_json (None: free text).

    All three are validated; when several ask for a schema the later one wins, as listed.
    """
    schema = _response_format_schema(body.get("response_format"))
    override = _structured_outputs_schema(body.get("structured_outputs"))
    if override is not None:
        schema = override
    if body.get("guided_json") is not None:
        schema = body["guided_json"]
    if schema is None:
        return None
    if isinstance(schema, str):
        schema = _parse_schema_text(schema)
    try:
        return _json_text(minimal_value(schema))
    except SchemaError as err:
        raise bad_request(f"the JSON schema is not one the sim engine can satisfy: {err}", "response_format") from None


def _free_text(response_format: JSONObject) -> JSONValue:
    """`{"type": "text"}`: no schema."""
    return None


def _any_object(response_format: JSONObject) -> JSONValue:
    """`{"type": "json_object"}`: any JSON object."""
    return {"type": "object"}


def _named_schema(response_format: JSONObject) -> JSONValue:
    """`{"type": "json_schema", "json_schema": {"schema": ...}}` (vLLM also reads a nested `json_schema`)."""
    spec = response_format.get("json_schema")
    inner = spec.get("schema", spec.get("json_schema")) if isinstance(spec, dict) else None
    if not isinstance(inner, dict):
        raise bad_request("response_format.json_schema.schema must be a JSON Schema object", "response_format")
    return inner


_RESPONSE_FORMATS: dict[str, Callable[[JSONObject], JSONValue]] = {
    "text": _free_text,
    "json_object": _any_object,
    "json_schema": _named_schema,
}
"""response_format type → the schema it asks for; any other type is refused."""


def _response_format_schema(response_format: JSONValue) -> JSONValue:
    """The schema OpenAI's `response_format` asks for (None: free text); an unknown type is a 400, not ignored."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if not isinstance(response_format, dict) or not isinstance(kind, str):
        raise bad_request("'response_format' must be an object with a 'type'", "response_format")
    schema_of = _RESPONSE_FORMATS.get(kind)
    if schema_of is None:
        raise bad_request(
            f"response_format type '{kind}' is not supported by the sim engine; use 'text', 'json_object' or 'json_schema'",
            "response_format",
        )
    return schema_of(response_format)


def _structured_outputs_schema(structured: JSONValue) -> JSONValue:
    """The schema vLLM's `structured_outputs` asks for (None: none); other constraint kinds are refused."""
    if structured is None:
        return None
    if not isinstance(structured, dict):
        raise bad_request("'structured_outputs' must be an object", "structured_outputs")
    for key, value in structured.items():
        if key not in ("json", "json_object") and value not in (None, False):
            raise bad_request(f"structured_outputs.{key} is not supported by the sim engine (only json, json_object)",
                              "structured_outputs")  # fmt: skip
    if structured.get("json") is not None:
        return structured["json"]
    if structured.get("json_object"):
        return {"type": "object"}
    return None


def _parse_schema_text(text: str) -> JSONValue:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise bad_request("the JSON schema given as a string is not valid JSON", "response_format") from None


def _json_text(value: JSONValue) -> str:
    """JSON as models write it (spaces after separators, ASCII-escaped)."""
    return json.dumps(value)


def check_combinations(features: Features, body: JSONObject) -> None:
    """Refuse options that would interact with the features in ways the sim does not model."""
    if not features.rich:
        return
    if body.get("stop"):
        raise bad_request("'stop' cannot be combined with thinking, tools, structured output, logprobs or n>1 "
                          "in the sim engine", "stop")  # fmt: skip
    if features.logprobs and body.get("echo"):
        raise bad_request("'echo' cannot be combined with 'logprobs' in the sim engine (no prompt logprobs)", "echo")
    fixed_answer = features.json_text is not None or features.forces_tool_call
    if fixed_answer and (body.get("ignore_eos") or body.get("min_tokens")):
        raise bad_request("'ignore_eos' and 'min_tokens' cannot be combined with structured output or a forced "
                          "tool call in the sim engine (the answer's length is the JSON's)", "ignore_eos")  # fmt: skip
