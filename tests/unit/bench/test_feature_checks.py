"""The feature checks and figures on hand-made records: each way an answer can be invalid, the rates, the SLO."""

from __future__ import annotations

import json

import pytest

from vlmserve.bench.features.assign import parse_features_flag, parse_tool_choice_flag, request_features
from vlmserve.bench.features.check import check_answers
from vlmserve.errors import UserError
from vlmserve.results import metrics
from vlmserve.results.records import RequestRecord
from vlmserve.spec import SLO

GOOD_FINDING = {"tooth": 12, "finding": "caries", "confidence": 0.5, "followup": True}
GOOD_VISIT = {"days_from_now": 3, "reason": "filling", "urgent": False}


def invalid_answer(*case: object, why: str) -> object:
    """A case whose answer is broken on purpose: a row of the hostile table (valid cases are not)."""
    return pytest.param(*case, marks=pytest.mark.hostile(f"bench --features: {why}: judged invalid with a one-line reason"))


def structured(index: int, text: str, finish: str = "stop", ok: bool = True) -> RequestRecord:
    return RequestRecord(
        request_id=f"s{index}",
        scheduled_at_s=1.0,
        sent_at_s=1.0,
        first_token_at_s=1.1,
        finished_at_s=1.5,
        ok=ok,
        features=["structured"],
        response_schema="radiograph_finding",
        answer_text=text,
        finish_reason=finish,
        output_tokens=20,
    )


def tools(index: int, calls: list[dict] | None, choice: str = "named", finish: str = "tool_calls") -> RequestRecord:
    return RequestRecord(
        request_id=f"t{index}",
        scheduled_at_s=1.0,
        sent_at_s=1.0,
        first_token_at_s=1.1,
        finished_at_s=1.5,
        ok=True,
        features=["tools"],
        offered_tools=["schedule_visit", "lookup_term"],
        tool_choice=choice,
        named_tool="schedule_visit" if choice == "named" else None,
        tool_call_text=json.dumps(calls) if calls is not None else None,
        finish_reason=finish,
        output_tokens=20,
    )


@pytest.mark.parametrize(("text", "finish", "valid", "reason"), [
    (json.dumps(GOOD_FINDING), "stop", True, None),
    ("  " + json.dumps(GOOD_FINDING) + "\n", "stop", True, None),  # whitespace around JSON is still JSON
    invalid_answer("```json\n" + json.dumps(GOOD_FINDING) + "\n```", "stop", False, "not JSON",
                   why="a structured answer wrapped in a markdown fence"),
    invalid_answer(json.dumps({**GOOD_FINDING, "tooth": 40}), "stop", False,
                   "schema: content['tooth'] 40 is greater than the maximum of 32", why="a structured answer out of range"),
    invalid_answer(json.dumps({**GOOD_FINDING, "extra": 1}), "stop", False, "schema: content Additional properties",
                   why="a structured answer with a property the schema forbids"),
    invalid_answer('{"tooth": 12, "find', "length", False, "cut at max_tokens: content",
                   why="a structured answer cut at max_tokens"),
    invalid_answer("", "stop", False, "no content", why="an empty structured answer"),
])  # fmt: skip
def test_structured_answers(text: str, finish: str, valid: bool, reason: str | None) -> None:
    record = structured(0, text, finish)
    check_answers([record])
    assert record.schema_valid is valid
    if reason is None:
        assert record.schema_error is None
    else:
        assert record.schema_error is not None and record.schema_error.startswith(reason), record.schema_error


@pytest.mark.parametrize(("calls", "choice", "valid", "reason"), [
    ([{"name": "schedule_visit", "arguments": json.dumps(GOOD_VISIT)}], "named", True, None),
    invalid_answer([{"name": "lookup_term", "arguments": json.dumps({"term": "enamel", "level": "primary"})}], "named", False,
                   "wrong tool", why="a call to another tool than the one named"),
    ([{"name": "lookup_term", "arguments": json.dumps({"term": "enamel", "level": "primary"})}], "required", True, None),
    invalid_answer([{"name": "drop_tables", "arguments": "{}"}], "auto", False, "unknown tool",
                   why="a call to a tool that was not offered"),
    invalid_answer([{"name": "schedule_visit", "arguments": "859781E0798"}], "named", False,
                   "schema: schedule_visit arguments", why="tool-call arguments that are a number, not an object"),
    invalid_answer([{"name": "schedule_visit", "arguments": '{"days_from_now": 3,'}], "named", False, "not JSON",
                   why="tool-call arguments that are cut JSON"),
    invalid_answer([{"name": "schedule_visit", "arguments": json.dumps(GOOD_VISIT)}, {"name": "schedule_visit", "arguments": "{}"}],
                   "required", False, "schema", why="one valid tool call and one against the schema"),  # every call must be valid
    invalid_answer(None, "named", False, "no tool call", why="no tool call where one was forced"),
    (None, "auto", None, "no tool call"),  # auto: not calling is allowed, so not judged
])  # fmt: skip
def test_tool_calls(calls: list[dict] | None, choice: str, valid: bool | None, reason: str | None) -> None:
    record = tools(0, calls, choice, finish="stop")
    check_answers([record])
    assert record.tool_call_valid is valid
    if reason is None:
        assert record.tool_call_error is None
    else:
        assert record.tool_call_error is not None and record.tool_call_error.startswith(reason), record.tool_call_error


def test_failed_requests_are_not_judged() -> None:
    record = structured(0, "", ok=False)
    check_answers([record])
    assert record.schema_valid is None


def test_rates_reasons_and_rate_slo_in_the_summary() -> None:
    records = [structured(i, json.dumps(GOOD_FINDING)) for i in range(9)] + [structured(9, "not json")]
    records += [tools(i, [{"name": "schedule_visit", "arguments": json.dumps(GOOD_VISIT)}]) for i in range(4)]
    records += [tools(4, None, choice="auto")]
    check_answers(records)
    summary = metrics.summarize(records, SLO.parse("schema_valid>=0.95,tool_call_valid>=99%"))
    features = summary.features
    assert features is not None
    assert (features.structured_requests, features.schema_valid, features.schema_valid_rate) == (10, 9, 0.9)
    assert (features.tool_requests, features.tool_calls_judged, features.tool_calls_valid) == (5, 4, 4)
    assert features.tool_call_valid_rate == 1.0 and features.answered_without_tool_call == 1
    assert features.invalid_reasons == {"structured: not JSON": 1}
    assert features.slo["schema_valid"].met is False and features.slo["tool_call_valid"].met is True
    assert features.slo_met is False
    assert summary.figure("features.schema_valid_rate") == 0.9


def test_reasoning_figures() -> None:
    records = []
    for index in range(4):
        record = RequestRecord(
            request_id=str(index),
            scheduled_at_s=0.0,
            sent_at_s=0.0,
            first_token_at_s=0.1,
            first_reasoning_at_s=0.1,
            first_answer_at_s=0.5 + index,
            finished_at_s=2.0 + index,
            ok=True,
            features=["thinking"],
            reasoning_tokens=30,
            output_tokens=40,
        )
        records.append(record)
    features = metrics.summarize(records, None).features
    assert features is not None and features.thinking_requests == features.requests_with_reasoning == 4
    assert features.reasoning_tokens.p50 == 30 and features.answer_tokens.p50 == 10
    assert features.time_to_first_reasoning_ms.p50 == pytest.approx(100.0)
    assert features.time_to_first_answer_ms.min == pytest.approx(500.0)
    assert (
        metrics.summarize([records[0].__class__(request_id="x", scheduled_at_s=0, sent_at_s=0, ok=True)], None).features is None
    )


def test_requests_get_their_features_deterministically() -> None:
    first = [request_features(["tools", "structured", "thinking"], "named", 7, f"c{i}:0") for i in range(200)]
    again = [request_features(["tools", "structured", "thinking"], "named", 7, f"c{i}:0") for i in range(200)]
    assert first == again
    with_tools = [features for features in first if "tools" in features.names]
    assert 60 < len(with_tools) < 140  # half and half
    assert all("thinking" in features.names for features in first)
    assert all((features.response_schema is None) == ("tools" in features.names) for features in first)
    assert all(features.named_tool in features.offered_tools for features in with_tools)
    body: dict = {"ignore_eos": True, "model": "m"}
    with_tools[0].apply(body, {})
    assert "ignore_eos" not in body and body["tool_choice"]["function"]["name"] == with_tools[0].named_tool
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    kept: dict = {"tool_choice": "auto"}
    with_tools[0].apply(kept, {"tool_choice": "auto"})  # --extra-body wins
    assert kept["tool_choice"] == "auto"


@pytest.mark.hostile("bench: an unknown or empty --features, --tool-choice without tools or unknown: one-line errors")
@pytest.mark.parametrize(("text", "message"), [
    ("tool", "error: --features: unknown feature 'tool'; use any of tools, structured, thinking (comma-separated)"),
    (",", "error: --features ',': name at least one of tools, structured, thinking"),
])  # fmt: skip
def test_bad_feature_flags(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_features_flag(text)
    assert f"error: {caught.value}" == message
    with pytest.raises(UserError, match="applies to --features tools"):
        parse_tool_choice_flag("auto", ["structured"])
    with pytest.raises(UserError, match="use one of named, required, auto"):
        parse_tool_choice_flag("any", ["tools"])


@pytest.mark.hostile("--slo rate objectives written as an equality, misspelt, out of 0..1, not a number or per type: one line")
@pytest.mark.parametrize(("text", "words"), [
    ("schema_valid=0.99", "a rate objective is a lower bound; write schema_valid>=0.99"),
    ("schema_vald>=0.99", "unknown rate objective 'schema_vald'; use schema_valid, tool_call_valid"),
    ("schema_valid>=1.5", "outside 0..1"),
    ("schema_valid>=most", "is not a fraction"),
    ("image:schema_valid>=0.9", "apply to the whole run"),
    ("ttft_p95>=1s", "unknown rate objective 'ttft_p95'"),
    ("valid=0.9", "unknown objective 'valid'; use <ttft|tpot|itl|e2e>_<p50|p90|p95|p99|p999|mean>=DURATION, or a rate "
                  "objective schema_valid / tool_call_valid>=FRACTION"),
])  # fmt: skip
def test_bad_rate_objectives(text: str, words: str) -> None:
    with pytest.raises(UserError) as caught:
        SLO.parse(text)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_rate_objectives_parse_beside_latency_ones() -> None:
    slo = SLO.parse("ttft_p95=500ms, schema_valid>=99%,tool_call_valid>=0.9")
    assert slo.bounds_s == {"ttft_p95": 0.5} and slo.min_rates == {"schema_valid": 0.99, "tool_call_valid": 0.9}


def _event(delta: dict, finish: str | None = None) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()


@pytest.mark.hostile(
    "bench client: malformed tool-call deltas in a stream (not an object, function not an object, arguments as an object): parsed without a crash"
)
def test_the_stream_parser_times_reasoning_and_answer_and_keeps_tool_calls() -> None:
    from vlmserve.bench.client import _StreamState

    state = _StreamState(keep_text=True)
    state.event(_event({"role": "assistant", "content": ""}), 1.0)
    state.event(_event({"reasoning": "let me", "reasoning_content": "let me"}), 2.0)
    state.event(_event({"reasoning_content": " think"}), 3.0)
    state.event(
        _event(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "schedule_visit", "arguments": ""}}
                ]
            }
        ),
        4.0,
    )
    state.event(_event({"tool_calls": [{"index": 0, "function": {"arguments": '{"days_from_now": 3,'}}]}), 5.0)
    state.event(_event({"tool_calls": [{"index": 0, "function": {"arguments": ' "reason": "filling"}'}}]}), 6.0)
    # hostile shapes: not a call, a function that is not an object, arguments sent as an object
    state.event(_event({"tool_calls": ["oops", {"index": 1, "function": ["x"]}]}), 7.0)
    state.event(_event({"tool_calls": [{"index": 2, "function": {"name": "lookup_term", "arguments": {"term": "x"}}}]}), 8.0)
    state.event(_event({}, finish="tool_calls"), 9.0)
    state.event(b"[DONE]", 9.0)
    assert (state.first, state.first_reasoning, state.first_answer) == (2.0, 2.0, 4.0)
    assert state.finish_reason == "tool_calls" and state.reasoning_chunks == 2
    calls = json.loads(state.tool_call_text() or "")
    assert calls == [
        {"name": "schedule_visit", "arguments": '{"days_from_now": 3, "reason": "filling"}'},
        {"name": None, "arguments": ""},
        {"name": "lookup_term", "arguments": '{"term": "x"}'},
    ]
