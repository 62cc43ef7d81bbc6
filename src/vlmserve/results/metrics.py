"""The one place where bench figures are computed from RequestRecords.

Every report, sweep, comparison and the planner's simulated runs read figures
produced here; nothing else computes TTFT, TPOT or ITL. The definitions are
written out in docs/metrics.md and must stay in step with this module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from vlmserve.results.blocks import ClientBlock, Distribution
from vlmserve.results.breakdown import ttft_breakdown
from vlmserve.results.records import RequestRecord
from vlmserve.results.summary import RunSummary, TokenCounts
from vlmserve.spec import REQUEST_TYPES, SLO

PERCENTILES: dict[str, float] = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
"""Percentile keys used in every distribution, in the order they are printed."""

DISTRIBUTION_KEYS = (*PERCENTILES, "mean", "std", "min", "max")


def distribution_ms(values_s: Sequence[float] | np.ndarray) -> dict[str, float | int | None]:
    """Percentiles, mean, std, min, max and the p50→p99 spread of values given in seconds, in ms.

    An empty input gives the same keys with None, so consumers never KeyError.
    Percentiles use linear interpolation (numpy's default), as `vllm bench serve` does.
    """
    return distribution(values_s, scale=1000.0)


def distribution(values: Sequence[float] | np.ndarray, scale: float = 1.0) -> dict[str, float | int | None]:
    """The same statistics as `distribution_ms` of `values` × `scale` (token counts: scale 1)."""
    data = np.asarray(values, dtype=float) * scale
    if data.size == 0:
        empty: dict[str, float | int | None] = {key: None for key in DISTRIBUTION_KEYS}
        empty.update(count=0, p50_p99_spread=None, p99_over_p50=None)
        return empty
    result: dict[str, float | int | None] = {key: float(np.percentile(data, q)) for key, q in PERCENTILES.items()}
    result.update(
        mean=float(data.mean()), std=float(data.std()), min=float(data.min()), max=float(data.max()), count=int(data.size)
    )
    p50, p99 = result["p50"], result["p99"]
    result["p50_p99_spread"] = float(p99 - p50)  # type: ignore[operator]
    result["p99_over_p50"] = float(p99 / p50) if p50 else None  # type: ignore[operator]
    return result


# --- per-request metric definitions ---------------------------------------------------------


def time_to_first_token_s(record: RequestRecord) -> float | None:
    """TTFT: first content-bearing chunk received − request sent."""
    return record.ttft_s


def end_to_end_s(record: RequestRecord) -> float | None:
    """E2E: last byte received − request sent."""
    return record.e2e_s


def output_token_count(record: RequestRecord) -> int | None:
    """Output tokens: the server's usage; else the sum of per-chunk token counts."""
    if record.output_tokens is not None:
        return record.output_tokens
    if record.chunk_tokens:
        return int(sum(record.chunk_tokens))
    return None


def time_per_output_token_s(record: RequestRecord) -> float | None:
    """TPOT: (E2E − TTFT) / (output tokens − 1); undefined for one-token answers."""
    ttft, e2e, tokens = record.ttft_s, record.e2e_s, output_token_count(record)
    if ttft is None or e2e is None or tokens is None or tokens < 2:
        return None
    return (e2e - ttft) / (tokens - 1)


def inter_token_latencies_s(record: RequestRecord) -> np.ndarray:
    """ITL values of one request, one per token after the first chunk.

    Each gap between consecutive content chunks is divided by the tokens the later
    chunk carried, and that per-token value is counted once per token, so a server
    that batches tokens into chunks is measured on the same per-token footing.
    """
    times = record.chunk_times_s
    if len(times) < 2:
        return np.empty(0)
    gaps = np.diff(np.asarray(times, dtype=float))
    if len(record.chunk_tokens) == len(times):
        tokens = np.maximum(np.asarray(record.chunk_tokens[1:], dtype=float), 1.0)
    else:
        tokens = np.ones_like(gaps)
    per_token = gaps / tokens
    return np.repeat(per_token, tokens.astype(int))


def mean_inter_token_latency_s(record: RequestRecord) -> float | None:
    """One request's mean ITL (used only to judge that request against an ITL objective)."""
    values = inter_token_latencies_s(record)
    return float(values.mean()) if values.size else None


PER_REQUEST_METRICS = {
    "ttft": time_to_first_token_s,
    "tpot": time_per_output_token_s,
    "itl": mean_inter_token_latency_s,
    "e2e": end_to_end_s,
}
"""Per-request values an SLO bound is checked against for goodput."""


# --- the run summary -------------------------------------------------------------------------


def measured(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """Records that count: everything except warm-up requests."""
    return [record for record in records if not record.warmup]


def measurement_window_s(records: Sequence[RequestRecord]) -> float:
    """From the first measured request's scheduled send to the last measured byte."""
    if not records:
        return 0.0
    start = min(min(record.scheduled_at_s, record.sent_at_s) for record in records)
    ends = [record.finished_at_s or record.sent_at_s for record in records]
    return max(max(ends) - start, 1e-9)


def _meets(record: RequestRecord, bounds_s: dict[str, float]) -> bool:
    if not record.ok:
        return False
    for metric, bound in bounds_s.items():
        value = PER_REQUEST_METRICS[metric](record)
        if value is not None and value > bound:
            return False
        if value is None and metric in ("ttft", "e2e"):
            return False
    return True


def goodput(records: Sequence[RequestRecord], slo: SLO | None, duration_s: float) -> dict[str, object] | None:
    """Requests/s that met every objective, the fraction of all requests, and each aggregate check.

    Per request, each objective's metric must be within its bound (the percentile in the
    key applies to the aggregate check, which is reported separately under `checks`).
    Failed requests never meet an SLO and stay in the denominator.
    """
    if slo is None or not slo.bounds_s:
        return None
    bounds = _per_request_bounds(slo)
    good = sum(1 for record in records if _meets(record, bounds))
    total = len(records)
    distributions = {
        "ttft": distribution_ms([r.ttft_s for r in records if r.ok and r.ttft_s is not None]),
        "tpot": distribution_ms([v for r in records if r.ok and (v := time_per_output_token_s(r)) is not None]),
        "itl": distribution_ms(_pooled_itl(records)),
        "e2e": distribution_ms([r.e2e_s for r in records if r.ok and r.e2e_s is not None]),
    }
    checks: dict[str, dict[str, object]] = {}
    for key, bound_s in slo.bounds_s.items():
        metric, stat = key.split("_", 1)
        value = distributions[metric].get(stat)
        checks[key] = {"bound_ms": bound_s * 1000.0, "measured_ms": value, "met": value is not None and value <= bound_s * 1000.0}
    return {
        "slo": {key: value * 1000.0 for key, value in slo.bounds_s.items()},
        "slo_text": ",".join(f"{key}={value * 1000.0:g}ms" for key, value in slo.bounds_s.items()),
        "good_requests": good,
        "requests_per_s": good / duration_s if duration_s > 0 else 0.0,
        "fraction": good / total if total else 0.0,
        "checks": checks,
        "all_met": all(check["met"] for check in checks.values()),
    }


def meets_slo(record: RequestRecord, slo: SLO) -> bool:
    """Did this request meet every per-request objective of `slo` (a failed request never does)?"""
    return _meets(record, _per_request_bounds(slo))


def _per_request_bounds(slo: SLO) -> dict[str, float]:
    """The tightest bound per metric when several percentiles of one metric are given."""
    bounds: dict[str, float] = {}
    for key, value in slo.bounds_s.items():
        metric = key.split("_", 1)[0]
        bounds[metric] = min(value, bounds.get(metric, value))
    return bounds


def _pooled_itl(records: Sequence[RequestRecord]) -> np.ndarray:
    parts = [inter_token_latencies_s(record) for record in records if record.ok]
    return np.concatenate(parts) if parts else np.empty(0)


def _latency_block(records: Sequence[RequestRecord]) -> dict[str, object]:
    ok = [record for record in records if record.ok]
    return {
        "ttft_ms": distribution_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": distribution_ms([v for r in ok if (v := time_per_output_token_s(r)) is not None]),
        "itl_ms": distribution_ms(_pooled_itl(ok)),
        "e2e_ms": distribution_ms([r.e2e_s for r in ok if r.e2e_s is not None]),
    }


@dataclass(frozen=True)
class TokenAgreement:
    """How far usage counts may drift from the tokenizer's before we flag it."""

    absolute: int = 1
    relative: float = 0.02


def _token_block(records: Sequence[RequestRecord], agreement: TokenAgreement) -> TokenCounts:
    ok = [record for record in records if record.ok]
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    output_tokens = [n for r in ok if (n := output_token_count(r)) is not None]
    requested_prompt = [r.requested_prompt_tokens for r in ok if r.requested_prompt_tokens is not None]
    requested_output = [r.requested_output_tokens for r in ok if r.requested_output_tokens is not None]
    prompt_mismatch = sum(
        1
        for r in ok
        if r.requested_prompt_tokens is not None
        and r.prompt_tokens is not None
        and r.image_count == 0
        and r.prompt_tokens != r.requested_prompt_tokens
    )
    output_mismatch = sum(
        1
        for r in ok
        if r.requested_output_tokens is not None and r.output_tokens is not None and r.output_tokens != r.requested_output_tokens
    )
    checked = [r for r in ok if r.output_tokens is not None and r.tokenizer_output_tokens is not None]
    disagreements = sum(
        1
        for r in checked
        if r.output_tokens is not None
        and r.tokenizer_output_tokens is not None
        and abs(r.output_tokens - r.tokenizer_output_tokens) > max(agreement.absolute, agreement.relative * r.output_tokens)
    )
    reasoning = [r.reasoning_tokens for r in ok if r.reasoning_tokens is not None]

    def mean(values: list[int]) -> float | None:
        return float(np.mean(values)) if values else None

    return TokenCounts(
        prompt_total=int(sum(prompt_tokens)),
        output_total=int(sum(output_tokens)),
        requested_prompt_mean=mean(requested_prompt),
        actual_prompt_mean=mean(prompt_tokens),
        requested_output_mean=mean(requested_output),
        actual_output_mean=mean(output_tokens),
        prompt_length_mismatches=prompt_mismatch,
        output_length_mismatches=output_mismatch,
        usage_missing=sum(1 for r in ok if r.output_tokens is None),
        tokenizer_checked=len(checked),
        usage_tokenizer_disagreements=disagreements,
        usage_tokenizer_disagree=disagreements > 0,
        reasoning_total=int(sum(reasoning)),
        requests_with_reasoning=sum(1 for n in reasoning if n > 0),
        tool_calls_total=int(sum(r.tool_calls for r in ok)),
        images_total=int(sum(r.image_count for r in records)),
    )


def send_lag_block(records: Sequence[RequestRecord], duration_s: float) -> ClientBlock:
    """Offered vs achieved send rate and the send-lag distribution (actual − scheduled send)."""
    if not records:
        return ClientBlock(send_lag_ms=Distribution(**distribution_ms([])), offered_rate=None, achieved_send_rate=None)
    scheduled = np.sort(np.asarray([r.scheduled_at_s for r in records], dtype=float))
    sent = np.sort(np.asarray([r.sent_at_s for r in records], dtype=float))
    span_scheduled = float(scheduled[-1] - scheduled[0])
    span_sent = float(sent[-1] - sent[0])
    n = len(records)
    return ClientBlock(
        send_lag_ms=Distribution(**distribution_ms([r.send_lag_s for r in records])),
        offered_rate=(n - 1) / span_scheduled if n > 1 and span_scheduled > 0 else None,
        achieved_send_rate=(n - 1) / span_sent if n > 1 and span_sent > 0 else None,
        requests_per_s_sent=n / duration_s if duration_s > 0 else None,
    )


def summarize(
    records: Sequence[RequestRecord],
    slo: SLO | None,
    duration_s: float | None = None,
    *,
    agreement: TokenAgreement = TokenAgreement(),
) -> RunSummary:
    """The run summary (the `--json-out` document minus `meta`, `server` and client CPU).

    `duration_s` is the measurement window; when None it is taken from the records
    (first measured scheduled send to last measured byte). Warm-up records are excluded;
    failed requests stay in every denominator.
    """
    counted = measured(records)
    window = duration_s if duration_s is not None else measurement_window_s(counted)
    ok = [record for record in counted if record.ok]
    failed_by_cause = Counter(record.error_kind or "unknown" for record in counted if not record.ok)
    tokens = _token_block(counted, agreement)
    chunks = sum(len(record.chunk_times_s) for record in ok)
    document: dict[str, object] = {
        "requests": {
            "total": len(counted),
            "completed": len(ok),
            "failed": len(counted) - len(ok),
            "failed_by_cause": dict(sorted(failed_by_cause.items())),
            "success_rate": len(ok) / len(counted) if counted else 0.0,
            "warmup_excluded": len(records) - len(counted),
        },
        "duration_s": window,
        "throughput": {
            "requests_per_s": len(ok) / window if window > 0 else 0.0,
            "output_tokens_per_s": tokens.output_total / window if window > 0 else 0.0,
            "input_tokens_per_s": tokens.prompt_total / window if window > 0 else 0.0,
            "total_tokens_per_s": (tokens.output_total + tokens.prompt_total) / window if window > 0 else 0.0,
            "chunks_per_s": chunks / window if window > 0 else 0.0,
        },
        **_latency_block(counted),
        "tokens": tokens,
        "goodput": goodput(counted, slo, window),
        "client": send_lag_block(counted, window),
    }
    turns = sorted({record.turn_index for record in counted})
    if len(turns) > 1:
        document["per_turn"] = {str(turn): _group_summary([r for r in counted if r.turn_index == turn]) for turn in turns}
    if counted:
        document["by_type"] = per_type(counted, slo, window)
    if any(record.features for record in counted):
        from vlmserve.results.features import feature_summary  # it builds on this module's distributions

        document["features"] = feature_summary(counted, slo)
    if any(record.adapter for record in records):
        from vlmserve.results.adapters import per_adapter  # it builds on this module's distributions

        document["by_adapter"] = per_adapter(records, counted)
    workloads = sorted({record.workload for record in counted})
    if len(workloads) > 1:
        document["per_workload"] = {name: _group_summary([r for r in counted if r.workload == name]) for name in workloads}
    return RunSummary.model_validate(document)


def _group_summary(records: Sequence[RequestRecord]) -> dict[str, object]:
    """Counts and latency distributions for one slice of a run (a turn, a workload)."""
    ok = [record for record in records if record.ok]
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        **_latency_block(records),
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in ok if r.prompt_tokens is not None]))
        if any(r.prompt_tokens is not None for r in ok)
        else None,
    }


IMAGE_TYPES = ("image", "multi-image")
"""Request types split by `image_repeat` (first sight of an image vs one sent before)."""

REPEAT_SPLITS = (("first", False), ("repeat", True))


def _mean(values: Sequence[float | int | None]) -> float | None:
    present = [value for value in values if value is not None]
    return float(np.mean(present)) if present else None


def _type_block(records: Sequence[RequestRecord], slo: SLO | None, request_type: str, duration_s: float) -> dict[str, object]:
    """One request type's counts, latencies, request size and TTFT breakdown, and its goodput if an SLO applies."""
    block = _group_summary(records)
    block["request_bytes_mean"] = _mean([record.request_bytes for record in records])
    block["breakdown"] = ttft_breakdown(records)
    objectives = slo.for_type(request_type) if slo is not None else None
    if objectives is not None and objectives.bounds_s:
        block["goodput"] = goodput(records, objectives, duration_s)
    return block


def per_type(records: Sequence[RequestRecord], slo: SLO | None, duration_s: float) -> dict[str, dict[str, object]]:
    """Figures per request type (text, image, ...), image types also split into first sight and repeats.

    Each type is judged by the run's SLO with its own objectives on top (`SLO.for_type`); its
    goodput is that type's good requests per second of the whole run's window.
    """
    order = {name: index for index, name in enumerate(REQUEST_TYPES)}
    types = sorted({record.request_type for record in records}, key=lambda name: (order.get(name, len(order)), name))
    blocks: dict[str, dict[str, object]] = {}
    for request_type in types:
        chosen = [record for record in records if record.request_type == request_type]
        block = _type_block(chosen, slo, request_type, duration_s)
        if request_type in IMAGE_TYPES and any(record.image_repeat is not None for record in chosen):
            block["by_repeat"] = {
                label: _type_block(part, slo, request_type, duration_s)
                for label, flag in REPEAT_SPLITS
                if (part := [record for record in chosen if record.image_repeat is flag])
            }
        blocks[request_type] = block
    return blocks


# --- was the client the bottleneck? -----------------------------------------------------------


@dataclass(frozen=True)
class ClientLimits:
    """Thresholds beyond which a run's figures say more about the client than the server."""

    send_lag_p99_s: float = 0.025
    achieved_over_offered: float = 0.95
    cpu_busy_fraction: float = 0.90


def judge_client(client: ClientBlock, limits: ClientLimits = ClientLimits(), *, open_loop: bool) -> ClientBlock:
    """Decide whether the client limited the run and say why (added to `client`).

    Send lag only matters for an open loop (a closed loop's user sends as soon as its
    previous answer ends, so its 'schedule' is its own finish time); CPU saturation of
    any worker process matters for both.
    """
    reasons: list[str] = []
    lag_p99 = client.send_lag_ms.p99
    if lag_p99 is not None and lag_p99 > limits.send_lag_p99_s * 1000.0:
        reasons.append(f"send lag p99 {lag_p99:.1f} ms > {limits.send_lag_p99_s * 1000:.0f} ms")
    offered, achieved = client.offered_rate, client.achieved_send_rate
    if open_loop and offered and achieved is not None and achieved < limits.achieved_over_offered * offered:
        reasons.append(f"sent {achieved:.1f} req/s of {offered:.1f} offered")
    for worker, busy in (client.cpu.worker_busy_fraction if client.cpu is not None else {}).items():
        if busy >= limits.cpu_busy_fraction:
            reasons.append(f"worker {worker} CPU {busy * 100:.0f}% busy")
    return client.model_copy(update={"limited": bool(reasons), "limited_reasons": reasons})
