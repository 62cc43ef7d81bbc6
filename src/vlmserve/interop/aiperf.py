"""AIPerf's `profile_export_aiperf.json` (aggregated statistics) read as a vlmserve run summary.

The file holds one object per metric, `{"unit": "ms", "avg": ..., "p50": ..., "p99": ...}`,
plus the run's duration, counts and `input_config`. It has no per-request data (that is
`profile_export.jsonl`), so an imported AIPerf run has figures but no records: no CDF or
timeline. Read both the layout of AIPerf's docs (`input_config.endpoint.model_names`,
`input_config.loadgen`) and the one AIPerf 0.13 writes (`input_config.models.items`,
`input_config.endpoint.urls`, `input_config.phases`; tests/fixtures/imports has a file from a
live 0.13 run).

Unless it ran with `--use-server-token-count`, AIPerf counts tokens by re-tokenising the text
with its own tokenizer, so its output tokens/s and per-token latencies follow that tokenizer,
not the server's count: the import says so in one warning (with the server's `usage` total when
the file has it). A file from a broken run (failed requests, a cancelled or incomplete run)
imports with a warning saying so.
"""

from __future__ import annotations

from vlmserve.errors import UserError
from vlmserve.interop.fields import broken_run_warning, mapping, number, objects
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.results.metrics import PERCENTILES
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary

TOOL = "aiperf"

METRIC_BLOCKS: dict[str, str] = {
    "time_to_first_token": "ttft_ms",
    "inter_token_latency": "tpot_ms",  # AIPerf's ITL is (latency - TTFT) / (output tokens - 1): vlmserve's TPOT
    "request_latency": "e2e_ms",
}
REQUIRED_KEYS = ("request_throughput", "benchmark_duration")
"""Blocks every AIPerf aggregate file has; TTFT is absent from a non-streaming run (then unknown)."""
_TO_MS = {"ms": 1.0, "sec": 1000.0, "s": 1000.0, "ns": 1e-6, "us": 1e-3}


def looks_like_aiperf(data: JSONValue) -> bool:
    return isinstance(data, dict) and all(isinstance(data.get(key), dict) for key in REQUIRED_KEYS)


def _value(data: JSONObject, name: str) -> float | None:
    entry = data.get(name)
    value = entry.get("avg") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _distribution(entry: JSONObject, name: str) -> dict[str, float | None]:
    unit = str(entry.get("unit", "ms"))
    if unit not in _TO_MS:
        raise UserError(f"AIPerf metric {name} is in '{unit}', not a time unit; is this a profile_export_aiperf.json?")
    scale = _TO_MS[unit]
    keys = {"mean": "avg", "std": "std", "min": "min", "max": "max", **{key: f"p{PERCENTILES[key]:g}" for key in PERCENTILES}}
    return {ours: value * scale if (value := number(entry.get(theirs))) is not None else None for ours, theirs in keys.items()}


def _first_model(config: JSONObject, endpoint: JSONObject) -> str | None:
    """The model: `models.items[0].name` (0.13) or `endpoint.model_names[0]` (earlier layouts)."""
    models = config.get("models")
    items = models.get("items") if isinstance(models, dict) else None
    if isinstance(items, list) and items and isinstance(items[0], dict) and items[0].get("name"):
        return str(items[0]["name"])
    names = endpoint.get("model_names")
    return str(names[0]) if isinstance(names, list) and names else None


def _load(config: JSONObject, endpoint: JSONObject) -> JSONObject:
    """Concurrency or rate, and the API: from the profiling phase (0.13) or `loadgen` (earlier)."""
    loadgen = mapping(config, "loadgen")
    phases = objects(config, "phases")
    profiling = next((phase for phase in phases if phase.get("kind") == "profiling"), phases[0] if phases else {})
    datasets = objects(config, "datasets")
    prompts = mapping(datasets[0], "prompts") if datasets else {}
    lengths = {ours: mapping(prompts, theirs).get("mean") for ours, theirs in (("input_len", "isl"), ("output_len", "osl"))}
    load = {
        "concurrency": profiling.get("concurrency", loadgen.get("concurrency")),
        "rate": profiling.get("request_rate", profiling.get("rate", loadgen.get("request_rate"))),
        "api": endpoint.get("type"),
        "dataset": datasets[0].get("type") if datasets else None,
        **{key: round(value) for key, value in lengths.items() if isinstance(value, (int, float))},
    }
    return {key: value for key, value in load.items() if value is not None}


def import_warnings(data: JSONObject) -> list[str]:
    """One line each: the token counts are AIPerf's re-tokenisation; the run was broken."""
    warnings: list[str] = []
    config = mapping(data, "input_config")
    endpoint = mapping(config, "endpoint")
    if not endpoint.get("use_server_token_count"):
        client, server = _value(data, "total_osl"), _value(data, "total_usage_completion_tokens")
        counts = (
            f" ({client:.0f} output tokens by AIPerf's count, {server:.0f} by the server's usage)"
            if client is not None and server is not None
            else ""
        )
        warnings.append(
            "AIPerf counted tokens by re-tokenising the text with its own tokenizer, not the server's "
            f"count{counts}: output tokens/s and TPOT follow that count "
            "(run AIPerf with --use-server-token-count for the server's)"
        )
    completed = _value(data, "request_count") or 0.0
    failed = _value(data, "error_request_count") or 0.0
    more = ["the run was cancelled"] if data.get("was_cancelled") is True else []
    if data.get("is_complete") is False:
        more.append("AIPerf marked the run incomplete")
    warnings += broken_run_warning("this AIPerf file", int(completed), int(failed), more)
    return warnings


def from_aiperf(data: JSONObject) -> RunResult:
    """AIPerf's aggregated statistics as a RunResult without records."""
    duration = _value(data, "benchmark_duration")
    count = _value(data, "request_count") or 0.0
    failed = _value(data, "error_request_count") or 0.0  # null when no request failed
    document: dict[str, object] = {
        "requests": {"total": int(count + failed), "completed": int(count), "failed": int(failed)},
        "duration_s": duration,
        "throughput": {
            "requests_per_s": _value(data, "request_throughput"),
            "output_tokens_per_s": _value(data, "output_token_throughput"),
        },
        "tokens": {"prompt_total": _whole(_value(data, "total_isl")), "output_total": _whole(_value(data, "total_osl"))},
    }
    for name, block in METRIC_BLOCKS.items():
        if isinstance(data.get(name), dict):
            document[block] = _distribution(mapping(data, name), name)
    config = mapping(data, "input_config")
    endpoint = mapping(config, "endpoint")
    urls = endpoint.get("urls")
    document["meta"] = {
        "model": _first_model(config, endpoint),
        "target": endpoint.get("url") or (urls[0] if isinstance(urls, list) and urls else None),
        "started_at": data.get("start_time"),
        "load_spec": _load(config, endpoint),
        "tool": TOOL,
        "tool_version": data.get("aiperf_version"),
        "simulated": False,  # the file does not say what served the requests
    }
    document["warnings"] = import_warnings(data)
    return RunResult(records=[], summary=RunSummary.from_partial(document))


def _whole(value: float | None) -> int | None:
    return None if value is None else int(round(value))
