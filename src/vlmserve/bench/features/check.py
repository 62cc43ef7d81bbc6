"""Judge each answer of a feature workload after the run, with a JSON Schema library (jsonschema).

Rules, each applied to requests that completed (a failed request is counted as failed, not as
an invalid answer):
- structured: the content must parse as JSON (nothing around it: no code fences) and validate
  against the response schema the request named;
- tools: every tool call must name one of the offered tools (the named one, for a named
  tool_choice), and its arguments must parse as JSON and validate against that tool's
  parameters. With a named or required tool_choice an answer without a call is invalid; with
  auto, not calling is the model's right, so such a request is not judged.
The reason for an invalid answer is kept short, "kind: detail", so the summary can count kinds.
The check runs in the parent after the load, never on the timing path of a worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache

import jsonschema

from vlmserve.bench.features.catalogue import RESPONSE_SCHEMAS, TOOLS
from vlmserve.json_types import JSONValue
from vlmserve.results.records import RequestRecord

DETAIL_CHARS = 120


@lru_cache(maxsize=None)
def _validator(kind: str, name: str) -> jsonschema.protocols.Validator:
    schema = RESPONSE_SCHEMAS[name] if kind == "response" else TOOLS[name]["parameters"]
    validator_class = jsonschema.validators.validator_for(schema)
    return validator_class(schema)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def _cut(record: RequestRecord) -> str:
    return "cut at max_tokens" if record.finish_reason == "length" else ""


def _json_problem(text: str, schema_kind: str, name: str, what: str, cut: str) -> tuple[JSONValue, str | None]:
    """(parsed value, None) when `text` is valid JSON for the schema, else (None, 'kind: detail')."""
    try:
        value = json.loads(text)
    except ValueError as err:
        return None, f"{cut or 'not JSON'}: {what} {_short(str(err))}"
    error = jsonschema.exceptions.best_match(_validator(schema_kind, name).iter_errors(value))
    if error is not None:
        path = "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]" for part in error.absolute_path)
        return None, f"schema: {what}{path} {_short(error.message)}"
    return value, None


def check_structured(record: RequestRecord) -> tuple[bool, str | None]:
    """Is the record's answer schema-valid? (valid, reason when not)."""
    assert record.response_schema is not None
    text = record.answer_text or ""
    if not text.strip():
        return False, f"{_cut(record) or 'no content'}: the answer had no text" + (
            " (a tool call instead)" if record.tool_call_text else ""
        )
    _, problem = _json_problem(text, "response", record.response_schema, "content", _cut(record))
    return problem is None, problem


def check_tool_calls(record: RequestRecord) -> tuple[bool | None, str | None]:
    """Are the record's tool calls valid? (valid, reason when not); valid None: not judged (auto, no call)."""
    offered = record.offered_tools or []
    calls = json.loads(record.tool_call_text) if record.tool_call_text else []
    if not calls:
        if record.tool_choice == "auto":
            return None, "no tool call: answered in text (tool_choice auto)"
        return False, f"{_cut(record) or 'no tool call'}: tool_choice {record.tool_choice} but the answer has no call"
    for call in calls:
        name = call.get("name")
        if name not in offered:
            return False, f"unknown tool: '{_short(str(name))}' is not one of {', '.join(offered)}"
        if record.tool_choice == "named" and name != record.named_tool:
            return False, f"wrong tool: called '{name}', tool_choice named '{record.named_tool}'"
        _, problem = _json_problem(call.get("arguments") or "", "tool", name, f"{name} arguments", _cut(record))
        if problem is not None:
            return False, problem
    return True, None


def check_answers(records: Iterable[RequestRecord]) -> None:
    """Fill each completed feature request's validity fields in place."""
    for record in records:
        if not record.ok or not record.features:
            continue
        if record.response_schema is not None:
            record.schema_valid, record.schema_error = check_structured(record)
        if record.offered_tools:
            record.tool_call_valid, record.tool_call_error = check_tool_calls(record)
