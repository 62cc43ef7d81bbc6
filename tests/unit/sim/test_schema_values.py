"""Minimal schema values are valid under jsonschema; schemas the sim cannot satisfy are refused."""

from __future__ import annotations

import random
from typing import Any

import jsonschema
import pytest

from vlmserve.engines.sim.features import parse_features
from vlmserve.engines.sim.options import OutputLengthDistribution
from vlmserve.engines.sim.protocol import ApiError, ParsedRequest
from vlmserve.engines.sim.rich_plan import RichPlan, plan_rich_output
from vlmserve.engines.sim.schema_values import SchemaError, minimal_value

VALID: list[dict[str, Any]] = [
    {},
    {"type": "object"},
    {"type": "string", "minLength": 25, "maxLength": 30},
    {"type": "string", "maxLength": 0},
    {"type": "string", "format": "date-time"},
    {"type": "integer", "minimum": -7, "maximum": -3},
    {"type": "integer", "exclusiveMinimum": 4, "multipleOf": 3},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.1},
    {"type": "number", "maximum": -2.5},
    {"type": ["null", "string"]},
    {"const": {"a": [1, 2]}},
    {"enum": [3, "x"]},
    {"anyOf": [{"type": "string", "minLength": 2}, {"type": "integer"}]},
    {"type": "array", "minItems": 3, "items": {"type": "boolean"}},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "array", "minItems": 1,
     "items": {"$ref": "#/$defs/leaf"}}}, "required": ["b"]}}, "required": ["a"], "additionalProperties": False,
     "$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "number", "minimum": 2.5}}, "required": ["v"]}}},
    {"type": "object", "minProperties": 2, "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}},
    {"type": "object", "required": ["free"], "additionalProperties": {"type": "integer", "minimum": 9}},
]  # fmt: skip
REFUSED: list[tuple[Any, str]] = [
    ({"type": "text"}, "'type' at # must be one of"),
    ({"type": "string", "pattern": "a"}, "uses 'pattern'"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength=5 is above maxLength=2"),
    ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, "no integer satisfies"),
    ({"enum": []}, "'enum' at # must be a non-empty list"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems=3 is above maxItems=1"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "required but not allowed"),
    ({"$ref": "#/$defs/missing"}, "points at nothing"),
    ({"$ref": "#/$defs/loop", "$defs": {"loop": {"$ref": "#/$defs/loop"}}}, "nests deeper"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "'oneOf' with several schemas"),
    ({"type": "number", "multipleOf": 0}, "'multipleOf' at # must be positive"),
    (False, "no value satisfies it"),
    ([1], "must be an object or a boolean"),
]


@pytest.mark.parametrize("schema", VALID)
def test_minimal_value_is_valid(schema: dict[str, Any]) -> None:
    value = minimal_value(schema)
    jsonschema.validate(value, schema)
    assert minimal_value(schema) == value  # deterministic


@pytest.mark.parametrize(("schema", "words"), REFUSED)
def test_unsatisfiable_or_unsupported_schemas_are_refused(schema: Any, words: str) -> None:
    with pytest.raises(SchemaError) as caught:
        minimal_value(schema)
    assert words in str(caught.value)


def _plan(
    body: dict[str, Any], max_tokens: int = 100, output_len: str = "fixed:5", prompt_len: int = 10, max_model_len: int = 4096
) -> RichPlan:
    features = parse_features(body, "chat")
    parsed = ParsedRequest(kind="chat", model="m", prompt_token_ids=list(range(prompt_len)), max_tokens=max_tokens)
    parsed.features = features
    return plan_rich_output(parsed, features, OutputLengthDistribution.parse(output_len), random.Random(1), max_model_len)


def test_reasoning_tokens_come_first_and_count_against_max_tokens() -> None:
    plan = _plan({"chat_template_kwargs": {"enable_thinking": True}}, max_tokens=8)
    choice = plan.choices[0]
    assert [t.channel for t in choice.tokens] == ["reasoning"] * 5 + ["content"] * 3
    assert choice.finish_reason == "length" and plan.num_tokens == 8 and plan.reasoning_tokens == 5


def test_n_choices_are_interleaved_round_robin_in_one_sequence() -> None:
    plan = _plan({"n": 3})
    assert plan.num_tokens == 15 and plan.order[:6] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert list(plan.token_ids) == [plan.token_id(i) for i in range(15)]


def test_n_choices_share_the_context_window() -> None:
    plan = _plan({"n": 4}, max_tokens=50, output_len="fixed:40", prompt_len=60, max_model_len=100)
    assert all(len(c.tokens) == 10 and c.finish_reason == "length" for c in plan.choices)


def test_tool_call_tokens_join_to_the_arguments() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 42}}, "required": ["a"]}}}  # fmt: skip
    choice = _plan({"tools": [tool], "tool_choice": "required"}).choices[0]
    assert choice.tokens[0].channel == "tool" and choice.tokens[0].text == "f"
    assert choice.text("args") == '{"a": 42}' and choice.finish_reason == "tool_calls"


def test_features_refusals_are_bad_requests() -> None:
    with pytest.raises(ApiError) as caught:
        parse_features({"n": 99}, "chat")
    assert caught.value.status == 400 and caught.value.param == "n"
