"""Thinking, tool calls, structured output, logprobs and n>1 on a real sim engine, through the official
`openai` SDK (streaming and not), and the 400s for what the sim engine cannot honour."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "sim-features-model"
ANSWER_TOKENS = 7
MESSAGES: list[Any] = [{"role": "user", "content": "What is in this X-ray?"}]

FINDINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "finding": {"type": "string", "minLength": 5, "maxLength": 40},
        "severity": {"enum": ["none", "mild", "severe"]},
        "confidence": {"type": "number", "minimum": 0.2, "maximum": 1},
        "regions": {
            "type": "array", "minItems": 2, "maxItems": 4,
            "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 3}, "label": {"type": "string"}},
                      "required": ["x", "label"], "additionalProperties": False},
        },
        "followup": {"type": ["boolean", "null"]},
        "code": {"$ref": "#/$defs/code"},
    },
    "required": ["finding", "severity", "confidence", "regions", "followup", "code"],
    "additionalProperties": False,
    "$defs": {"code": {"type": "integer", "multipleOf": 5, "exclusiveMinimum": 12}},
}  # fmt: skip
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at a place",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 2},
                                                         "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                       "required": ["city", "unit", "days"]},
    },
}  # fmt: skip
REPORT_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "file_report", "parameters": FINDINGS_SCHEMA}}


@pytest.fixture(scope="module")
def engine() -> Iterator[SimHandle]:
    with start_sim_engine(
        model=MODEL, ttft_ms=5, itl_ms=1, seed=5, max_model_len=4096, output_len=f"fixed:{ANSWER_TOKENS}"
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(engine: SimHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _chat(client: openai.OpenAI, **options: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, **options)


def _stream(client: openai.OpenAI, **options: Any) -> list[Any]:
    return list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **options))


def _extra(obj: Any, name: str) -> Any:
    """A vLLM field the SDK's models may not declare (then kept as an extra attribute)."""
    return getattr(obj, name, None)


def _token_count(engine: SimHandle, text: str) -> int:
    return int(httpx.post(engine.base_url + "/tokenize", json={"model": MODEL, "prompt": text}).json()["count"])


# -- thinking --------------------------------------------------------------------------------------
def test_thinking_puts_reasoning_before_the_answer_and_bills_it(client: openai.OpenAI) -> None:
    response = _chat(client, seed=1, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = response.choices[0].message
    reasoning = _extra(message, "reasoning")
    assert reasoning and reasoning == _extra(message, "reasoning_content")
    assert message.content and response.choices[0].finish_reason == "stop"
    usage = response.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == ANSWER_TOKENS
    assert usage.completion_tokens == 2 * ANSWER_TOKENS


def test_thinking_streams_reasoning_deltas_then_content_deltas(client: openai.OpenAI) -> None:
    whole = _chat(client, seed=2, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    chunks = _stream(client, seed=2, stream_options={"include_usage": True},
                     extra_body={"chat_template_kwargs": {"enable_thinking": True}})  # fmt: skip
    kinds = []
    reasoning, content = "", ""
    for chunk in chunks:
        for choice in chunk.choices:
            if _extra(choice.delta, "reasoning"):
                kinds.append("r")
                reasoning += _extra(choice.delta, "reasoning")
                assert _extra(choice.delta, "reasoning_content") == _extra(choice.delta, "reasoning")
            if choice.delta.content:
                kinds.append("c")
                content += choice.delta.content
    assert kinds == ["r"] * ANSWER_TOKENS + ["c"] * ANSWER_TOKENS
    assert reasoning == _extra(whole.choices[0].message, "reasoning") and content == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2 * ANSWER_TOKENS


def test_reasoning_effort_scales_or_disables_thinking(client: openai.OpenAI) -> None:
    low = _chat(client, seed=3, reasoning_effort="low")
    assert low.usage is not None and low.usage.completion_tokens_details is not None
    assert low.usage.completion_tokens_details.reasoning_tokens == round(ANSWER_TOKENS * 0.5)
    off = _chat(client, seed=3, reasoning_effort="none")
    assert _extra(off.choices[0].message, "reasoning") is None
    assert off.usage is not None and off.usage.completion_tokens == ANSWER_TOKENS


def test_include_reasoning_false_hides_but_bills_the_thinking(client: openai.OpenAI) -> None:
    options: dict[str, Any] = {
        "seed": 4,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": True}, "include_reasoning": False},
    }
    response = _chat(client, **options)
    assert _extra(response.choices[0].message, "reasoning") is None and response.choices[0].message.content
    assert response.usage is not None and response.usage.completion_tokens == 2 * ANSWER_TOKENS
    chunks = _stream(client, **options)
    assert not any(_extra(choice.delta, "reasoning") for chunk in chunks for choice in chunk.choices)


def test_thinking_cut_by_max_tokens_is_length_without_content(client: openai.OpenAI) -> None:
    response = _chat(client, seed=4, max_tokens=3, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    choice = response.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    assert response.usage is not None and response.usage.completion_tokens == 3


# -- tool calls ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "file_report"}}])
def test_forced_tool_call_has_schema_valid_arguments(client: openai.OpenAI, tool_choice: Any) -> None:
    response = _chat(client, tools=[WEATHER_TOOL, REPORT_TOOL], tool_choice=tool_choice, seed=6)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    schema = {"get_weather": WEATHER_TOOL, "file_report": REPORT_TOOL}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    if isinstance(tool_choice, dict):
        assert call.function.name == "file_report"


def test_streamed_tool_call_deltas_as_vllm_sends_them(client: openai.OpenAI) -> None:
    options: dict[str, Any] = {"tools": [REPORT_TOOL], "tool_choice": "required", "seed": 7}
    whole = _chat(client, **options)
    chunks = _stream(client, **options)
    deltas = [tc for chunk in chunks for choice in chunk.choices for tc in (choice.delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.id and first.type == "function" and first.function is not None
    assert first.function.name == "file_report" and first.function.arguments == ""
    assert rest and all(d.id is None and d.function is not None and d.function.name is None for d in rest)
    arguments = "".join(d.function.arguments or "" for d in rest if d.function is not None)
    jsonschema.validate(json.loads(arguments), FINDINGS_SCHEMA)
    whole_call = whole.choices[0].message.tool_calls
    assert whole_call and arguments == whole_call[0].function.arguments and first.id == whole_call[0].id
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_auto_tool_choice_calls_a_tool_for_a_seeded_share(client: openai.OpenAI) -> None:
    outcomes = []
    for seed in range(16):
        choice = _chat(client, tools=[WEATHER_TOOL], seed=seed).choices[0]
        outcomes.append(choice.finish_reason)
        if choice.finish_reason == "tool_calls":
            assert choice.message.tool_calls and choice.message.content is None
        else:
            assert choice.message.content and not choice.message.tool_calls
    assert {"tool_calls", "stop"} <= set(outcomes)
    again = [_chat(client, tools=[WEATHER_TOOL], seed=seed).choices[0].finish_reason for seed in range(16)]
    assert again == outcomes


def test_tool_choice_none_answers_text(client: openai.OpenAI) -> None:
    choice = _chat(client, tools=[WEATHER_TOOL], tool_choice="none", seed=8).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content and not choice.message.tool_calls


# -- structured output -----------------------------------------------------------------------------
def test_json_schema_response_is_valid_and_billed_by_the_tokenizer(client: openai.OpenAI, engine: SimHandle) -> None:
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "findings", "schema": FINDINGS_SCHEMA}}
    response = _chat(client, response_format=response_format, seed=9)
    content = response.choices[0].message.content
    assert content is not None and response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(content), FINDINGS_SCHEMA)
    assert response.usage is not None and response.usage.completion_tokens == _token_count(engine, content)
    streamed = "".join(
        c.choices[0].delta.content or "" for c in _stream(client, response_format=response_format, seed=9) if c.choices
    )
    assert streamed == content


def test_json_object_and_guided_json(client: openai.OpenAI) -> None:
    content = _chat(client, response_format={"type": "json_object"}).choices[0].message.content
    assert isinstance(json.loads(content or ""), dict)
    guided = _chat(client, extra_body={"guided_json": WEATHER_TOOL["function"]["parameters"]}).choices[0].message.content
    jsonschema.validate(json.loads(guided or ""), WEATHER_TOOL["function"]["parameters"])
    structured = _chat(client, extra_body={"structured_outputs": {"json": FINDINGS_SCHEMA}}).choices[0].message.content
    jsonschema.validate(json.loads(structured or ""), FINDINGS_SCHEMA)


def test_completions_honour_a_json_schema(client: openai.OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt="Findings as JSON:", extra_body={
        "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": FINDINGS_SCHEMA}}})  # fmt: skip
    jsonschema.validate(json.loads(response.choices[0].text), FINDINGS_SCHEMA)


def test_json_cut_by_max_tokens_is_length(client: openai.OpenAI) -> None:
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "findings", "schema": FINDINGS_SCHEMA}}
    full = _chat(client, response_format=response_format).choices[0].message.content or ""
    cut = _chat(client, response_format=response_format, max_tokens=5)
    assert cut.choices[0].finish_reason == "length" and cut.usage is not None and cut.usage.completion_tokens == 5
    assert full.startswith(cut.choices[0].message.content or "") and len(cut.choices[0].message.content or "") < len(full)


# -- logprobs --------------------------------------------------------------------------------------
def _check_chat_logprobs(entries: list[Any], top: int) -> None:
    for entry in entries:
        assert entry.logprob < 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == top
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and entry.top_logprobs[0].token == entry.token
        assert sum(2.718281828**v for v in values) <= 1.0 + 1e-9


def test_chat_logprobs_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    response = _chat(client, logprobs=True, top_logprobs=3, seed=10)
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and len(logprobs.content) == ANSWER_TOKENS
    _check_chat_logprobs(logprobs.content, 3)
    assert "".join(e.token for e in logprobs.content) == response.choices[0].message.content
    streamed = [entry for chunk in _stream(client, logprobs=True, top_logprobs=3, seed=10)
                for choice in chunk.choices if choice.logprobs and choice.logprobs.content for entry in choice.logprobs.content]  # fmt: skip
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in logprobs.content]


def test_completion_logprobs(client: openai.OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt="The chest film shows", logprobs=2, seed=11)
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.text_offset is not None
    assert len(logprobs.tokens) == ANSWER_TOKENS and "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    assert logprobs.top_logprobs is not None and all(len(top) == 2 for top in logprobs.top_logprobs)
    chunks = list(client.completions.create(model=MODEL, prompt="The chest film shows", logprobs=2, seed=11, stream=True))
    assert [t for c in chunks for t in ((c.choices[0].logprobs.tokens or []) if c.choices[0].logprobs else [])] == logprobs.tokens


# -- n > 1 -----------------------------------------------------------------------------------------
def test_n_choices_non_streaming_and_streaming(client: openai.OpenAI) -> None:
    response = _chat(client, n=3, seed=12)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert response.usage is not None and response.usage.completion_tokens == 3 * ANSWER_TOKENS
    texts = [c.message.content for c in response.choices]
    assert len(set(texts)) == 3
    chunks = _stream(client, n=3, seed=12, stream_options={"include_usage": True})
    order = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content]
    assert order == [0, 1, 2] * ANSWER_TOKENS
    streamed = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)
    ]
    assert streamed == texts
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finishes == {0: "stop", 1: "stop", 2: "stop"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3 * ANSWER_TOKENS


def test_completion_n(client: openai.OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt="Impression:", n=2, max_tokens=4)
    assert [c.index for c in response.choices] == [0, 1] and all(c.finish_reason == "length" for c in response.choices)
    assert response.usage is not None and response.usage.completion_tokens == 8


def test_features_combine(client: openai.OpenAI) -> None:
    response = _chat(client, n=2, logprobs=True, top_logprobs=1, tools=[WEATHER_TOOL], tool_choice="required",
                     seed=13, extra_body={"chat_template_kwargs": {"enable_thinking": True}})  # fmt: skip
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls" and _extra(choice.message, "reasoning")
        assert choice.message.tool_calls
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), WEATHER_TOOL["function"]["parameters"])
        assert choice.logprobs is not None and choice.logprobs.content


def _generation_tokens(engine: SimHandle) -> float:
    text = httpx.get(engine.base_url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:generation_tokens_total"))


def test_every_billed_token_is_a_scheduled_output_token(client: openai.OpenAI, engine: SimHandle) -> None:
    """Reasoning, tool-call and n>1 tokens go through the scheduler like plain ones (the engine's own counter)."""
    before = _generation_tokens(engine)
    response = _chat(client, n=2, tools=[WEATHER_TOOL], tool_choice="required", seed=14,
                     extra_body={"chat_template_kwargs": {"enable_thinking": True}})  # fmt: skip
    assert response.usage is not None
    assert _generation_tokens(engine) - before == response.usage.completion_tokens


# -- what the sim engine cannot honour -------------------------------------------------------------
HOSTILE: list[tuple[dict[str, Any], str, str]] = [
    ({"response_format": {"type": "xml"}}, "response_format", "response_format type 'xml' is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "json_schema.schema must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strnig"}}}}, "response_format", "'type' at # must be one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "^a+$"}}}},
     "response_format", "uses 'pattern'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 5, "maximum": 2}}}},
     "response_format", "no integer satisfies"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "wat"}}, "required": ["a"]}}}]},
     "tools", "tools[0].function.parameters is not a schema"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "function.name must be"),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools", "used twice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice", "'launch', which is not in `tools`"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ({"tool_choice": "required"}, "tool_choice", "`tools` must be set"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs=21 is above the maximum of 20"),
    ({"top_logprobs": 2}, "top_logprobs", "`logprobs` must be set to true"),
    ({"logprobs": 3}, "logprobs", "must be a boolean"),
    ({"n": 17}, "n", "n must be between 1 and 16"),
    ({"n": 0}, "n", "n must be between 1 and 16"),
    ({"best_of": 2}, "best_of", "'best_of' is not supported"),
    ({"use_beam_search": True}, "use_beam_search", "beam search is not supported"),
    ({"guided_regex": "a+"}, "guided_regex", "'guided_regex') is not supported"),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs", "structured_outputs.grammar is not supported"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "'reasoning_effort' must be one of"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs", "enable_thinking must be a boolean"),
    ({"n": 2, "stop": ["."]}, "stop", "'stop' cannot be combined"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "cannot be combined with structured output"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined with a forced tool_choice"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param", "words"), HOSTILE, ids=[h[2][:40] for h in HOSTILE])
def test_what_cannot_be_honoured_is_a_400(engine: SimHandle, extra: dict[str, Any], param: str, words: str) -> None:
    response = httpx.post(
        engine.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **extra}, timeout=30
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == param
    assert words in error["message"], error["message"]


def test_completion_refusals(engine: SimHandle) -> None:
    for extra, words in [({"tools": [WEATHER_TOOL]}, "applies to /v1/chat/completions only"),
                         ({"logprobs": 21}, "logprobs=21 is above the maximum"),
                         ({"logprobs": 1, "echo": True}, "'echo' cannot be combined with 'logprobs'")]:  # fmt: skip
        response = httpx.post(engine.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", **extra}, timeout=30)
        assert response.status_code == 400 and words in response.json()["error"]["message"], response.text


def test_the_sdk_raises_bad_request_for_a_refused_option(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert caught.value.status_code == 400 and "'nope', which is not in `tools`" in caught.value.message
