"""Figures of the feature workloads (tools, structured output, thinking), from the records' checks.

The checks themselves (is this answer schema-valid, is this tool call valid) are made once per
request by `bench.features.check` and stored on the record; this module only counts them and
times the reasoning, so a stored run's figures can be recomputed from its records alone.

- schema-valid rate: schema-valid answers / completed structured requests.
- valid tool-call rate: requests whose every call is valid / completed tools requests judged
  (a named or required tool_choice judges every one; auto only those that called a tool).
- reasoning tokens: usage's `completion_tokens_details.reasoning_tokens`, else the tokens of the
  reasoning chunks; answer tokens: output tokens minus reasoning tokens.
- time to first reasoning token: first reasoning chunk − sent; time to first answer token: first
  content or tool-call chunk − sent (TTFT is whichever came first).
Failed requests are not in these denominators: they are counted as failures in `requests`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from vlmserve.results.metrics import distribution, distribution_ms
from vlmserve.results.records import RequestRecord
from vlmserve.spec import SLO

REASON_KINDS_SHOWN = 8
"""Invalid-answer reason kinds kept in the summary (most frequent first)."""


def _rate(good: int, judged: int) -> float | None:
    return good / judged if judged else None


def _reason_kinds(records: Sequence[RequestRecord]) -> dict[str, int]:
    """'structured: not JSON' → count, over every invalid answer, most frequent first."""
    kinds: Counter[str] = Counter()
    for record in records:
        if record.schema_valid is False and record.schema_error:
            kinds["structured: " + record.schema_error.split(":", 1)[0]] += 1
        if record.tool_call_valid is False and record.tool_call_error:
            kinds["tools: " + record.tool_call_error.split(":", 1)[0]] += 1
    return dict(kinds.most_common(REASON_KINDS_SHOWN))


def _rate_checks(rates: dict[str, float | None], slo: SLO | None) -> dict[str, dict[str, object]]:
    """Each rate objective with its measured value and verdict (a rate not measured misses)."""
    checks: dict[str, dict[str, object]] = {}
    for name, bound in (slo.min_rates if slo is not None else {}).items():
        measured = rates.get(name)
        checks[name] = {"bound": bound, "measured": measured, "met": measured is not None and measured >= bound}
    return checks


def feature_summary(records: Sequence[RequestRecord], slo: SLO | None) -> dict[str, object]:
    """The `features` block of a run summary (measured records only, warm-up already left out)."""
    requested = sorted({name for record in records for name in record.features or []})
    ok = [record for record in records if record.ok and record.features]
    structured = [record for record in ok if record.response_schema is not None]
    schema_valid = sum(1 for record in structured if record.schema_valid)
    tools = [record for record in ok if record.offered_tools]
    judged = [record for record in tools if record.tool_call_valid is not None]
    calls_valid = sum(1 for record in judged if record.tool_call_valid)
    thinking = [record for record in ok if "thinking" in (record.features or [])]
    reasoned = [record for record in thinking if record.reasoning_tokens]
    rates = {"schema_valid": _rate(schema_valid, len(structured)), "tool_call_valid": _rate(calls_valid, len(judged))}
    checks = _rate_checks(rates, slo)
    return {
        "requested": requested,
        "tool_choices": sorted({record.tool_choice for record in tools if record.tool_choice}),
        "structured_requests": len(structured),
        "schema_valid": schema_valid,
        "schema_valid_rate": rates["schema_valid"],
        "tool_requests": len(tools),
        "tool_calls_judged": len(judged),
        "tool_calls_valid": calls_valid,
        "tool_call_valid_rate": rates["tool_call_valid"],
        "answered_without_tool_call": sum(1 for record in tools if not record.tool_call_text),
        "invalid_reasons": _reason_kinds(ok),
        "thinking_requests": len(thinking),
        "requests_with_reasoning": len(reasoned),
        "reasoning_tokens": distribution([record.reasoning_tokens or 0 for record in thinking]),
        "answer_tokens": distribution(
            [record.output_tokens - (record.reasoning_tokens or 0) for record in thinking if record.output_tokens is not None]
        ),
        "time_to_first_reasoning_ms": distribution_ms(
            [record.first_reasoning_at_s - record.sent_at_s for record in ok if record.first_reasoning_at_s is not None]
        ),
        "time_to_first_answer_ms": distribution_ms(
            [record.first_answer_at_s - record.sent_at_s for record in ok if record.first_answer_at_s is not None]
        ),
        "slo": checks,
        "slo_met": all(check["met"] for check in checks.values()) if checks else None,
    }
