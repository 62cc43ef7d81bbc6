"""AIPerf's `profile_export_aiperf.json` (aggregated statistics) read as a vlmserve run summary.

The file holds one object per metric, `{"unit": "ms", "avg": ..., "p50": ..., "p99": ...}`,
plus the run's duration, counts and `input_config`. It has no per-request data (that is
`profile_export.jsonl`), so an imported AIPerf run has figures but no records: no CDF or
timeline. Layout per AIPerf's docs (`docs/tutorials/working-with-profile-exports.md`); checked
against that documented example, not against a file from a live AIPerf run.
"""

from __future__ import annotations

from typing import Any

from vlmserve.results.metrics import PERCENTILES
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary
from vlmserve.errors import UserError

TOOL = "aiperf"

METRIC_BLOCKS: dict[str, str] = {
    "time_to_first_token": "ttft_ms",
    "inter_token_latency": "tpot_ms",  # AIPerf's ITL is (latency - TTFT) / (output tokens - 1): vlmserve's TPOT
    "request_latency": "e2e_ms",
}
REQUIRED_KEYS = ("request_throughput", "time_to_first_token", "benchmark_duration")
_TO_MS = {"ms": 1.0, "sec": 1000.0, "s": 1000.0, "ns": 1e-6, "us": 1e-3}


def looks_like_aiperf(data: Any) -> bool:
    return isinstance(data, dict) and all(isinstance(data.get(key), dict) for key in REQUIRED_KEYS)


def _value(data: dict[str, Any], name: str) -> float | None:
    entry = data.get(name)
    value = entry.get("avg") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _distribution(entry: dict[str, Any], name: str) -> dict[str, float | None]:
    unit = str(entry.get("unit", "ms"))
    if unit not in _TO_MS:
        raise UserError(f"AIPerf metric {name} is in '{unit}', not a time unit; is this a profile_export_aiperf.json?")
    scale = _TO_MS[unit]
    keys = {"mean": "avg", "std": "std", "min": "min", "max": "max",
            **{key: f"p{PERCENTILES[key]:g}" for key in PERCENTILES}}
    return {ours: float(entry[theirs]) * scale if isinstance(entry.get(theirs), (int, float)) else None
            for ours, theirs in keys.items()}


def from_aiperf(data: dict[str, Any]) -> RunResult:
    """AIPerf's aggregated statistics as a RunResult without records."""
    duration = _value(data, "benchmark_duration")
    count = _value(data, "request_count") or 0.0
    failed = _value(data, "error_request_count") or 0.0  # null when no request failed
    document: dict[str, Any] = {
        "requests": {"total": int(count + failed), "completed": int(count), "failed": int(failed)},
        "duration_s": duration,
        "throughput": {"requests_per_s": _value(data, "request_throughput"),
                       "output_tokens_per_s": _value(data, "output_token_throughput")},
        "tokens": {"prompt_total": _whole(_value(data, "total_isl")), "output_total": _whole(_value(data, "total_osl"))},
    }
    for name, block in METRIC_BLOCKS.items():
        if isinstance(data.get(name), dict):
            document[block] = _distribution(data[name], name)
    config = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    endpoint = (config or {}).get("endpoint") or {}
    loadgen = (config or {}).get("loadgen") or {}
    models = endpoint.get("model_names") or []
    load = {"concurrency": loadgen.get("concurrency"), "rate": loadgen.get("request_rate"),
            "api": endpoint.get("type")}
    document["meta"] = {
        "model": models[0] if models else None,
        "target": endpoint.get("url"),
        "started_at": data.get("start_time"),
        "load_spec": {key: value for key, value in load.items() if value is not None},
        "tool": TOOL,
        "simulated": False,
    }
    return RunResult(records=[], summary=RunSummary.from_partial(document))


def _whole(value: float | None) -> int | None:
    return None if value is None else int(round(value))
