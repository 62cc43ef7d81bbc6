"""guidellm 0.8's benchmarks JSON (`guidellm run --output kind=json`) read as vlmserve runs.

One file holds one benchmark per load level of the run (a sweep has several); each becomes
its own run, labelled with guidellm's strategy (`concurrent@4`, `constant@2.0`). Figures are
guidellm's own, from `metrics.<name>.successful` (milliseconds for the `_ms` metrics, seconds
for `request_latency`); its `time_per_output_token_ms` is vlmserve's TPOT and its
`inter_token_latency_ms` vlmserve's ITL. Request samples are not read: guidellm keeps only a
sample, so a CDF from them would mislead; an imported guidellm run has figures, no records.
"""

from __future__ import annotations

from datetime import datetime, timezone

from vlmserve.errors import UserError
from vlmserve.interop.fields import broken_run_warning, count, mapping, number, objects
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.results.metrics import PERCENTILES
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary

TOOL = "guidellm"

METRIC_BLOCKS: dict[str, tuple[str, float]] = {
    "time_to_first_token_ms": ("ttft_ms", 1.0),
    "time_per_output_token_ms": ("tpot_ms", 1.0),
    "inter_token_latency_ms": ("itl_ms", 1.0),
    "request_latency": ("e2e_ms", 1000.0),  # guidellm keeps this one in seconds
}
"""guidellm metric -> (vlmserve summary block, factor to milliseconds)."""


def looks_like_guidellm(data: JSONValue) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("benchmarks"), list)
        and isinstance(data.get("metadata"), dict)
        and "guidellm_version" in mapping(data, "metadata")
    )


def _successful(metrics: JSONObject, name: str) -> JSONObject:
    entry = metrics.get(name)
    block = entry.get("successful") if isinstance(entry, dict) else None
    return block if isinstance(block, dict) else {}


def _distribution(block: JSONObject, scale: float) -> dict[str, float | None]:
    percentiles = mapping(block, "percentiles")
    values: JSONObject = {
        "mean": block.get("mean"),
        "std": block.get("std_dev"),
        "min": block.get("min"),
        "max": block.get("max"),
        **{key: percentiles.get(key) for key in PERCENTILES},
    }
    values["p50"] = percentiles.get("p50", block.get("median"))
    return {key: None if (figure := number(value)) is None else figure * scale for key, value in values.items()}


def _load(strategy: JSONObject, backend: JSONObject, source: JSONObject) -> JSONObject:
    kind = str(strategy.get("type_", ""))
    load: JSONObject = {"strategy": kind or None, "dataset": source.get("kind")}
    for ours, theirs in (("input_len", "prompt_tokens"), ("output_len", "output_tokens")):
        if isinstance(source.get(theirs), (int, float)):
            load[ours] = source[theirs]
    if kind == "concurrent":
        load["concurrency"] = strategy.get("streams")
    elif kind == "synchronous":
        load["concurrency"] = 1
    elif strategy.get("rate") is not None:
        load["rate"] = strategy.get("rate")
    route = str(backend.get("request_format") or "")
    load["api"] = "chat" if "chat" in route else ("completions" if route else None)
    return {key: value for key, value in load.items() if value is not None}


def _strategy_name(strategy: JSONObject) -> str:
    kind = str(strategy.get("type_") or "benchmark")
    level = strategy.get("streams") if kind == "concurrent" else strategy.get("rate")
    return f"{kind}@{level:g}" if isinstance(level, (int, float)) else kind


def _one(benchmark: JSONObject, version: str | None, source: JSONObject) -> RunResult:
    if not isinstance(benchmark, dict) or not isinstance(benchmark.get("metrics"), dict):
        raise ValueError("a benchmark has no metrics object")
    metrics = mapping(benchmark, "metrics")
    config = mapping(benchmark, "config")
    strategy = mapping(config, "strategy")
    backend = mapping(config, "backend")
    totals = mapping(metrics, "request_totals")
    completed = count(totals.get("successful"))
    failed = count(totals.get("errored")) + count(totals.get("incomplete"))
    output_tokens = number(_successful(metrics, "output_token_count").get("total_sum"))
    prompt_tokens = number(_successful(metrics, "prompt_token_count").get("total_sum"))
    document: dict[str, object] = {
        "requests": {"total": completed + failed, "completed": completed, "failed": failed},
        "duration_s": number(benchmark.get("duration")),
        "throughput": {
            "requests_per_s": number(_successful(metrics, "requests_per_second").get("mean")),
            "output_tokens_per_s": number(_successful(metrics, "output_tokens_per_second").get("mean")),
            "total_tokens_per_s": number(_successful(metrics, "tokens_per_second").get("mean")),
        },
        "tokens": {
            "prompt_total": None if prompt_tokens is None else round(prompt_tokens),
            "output_total": None if output_tokens is None else round(output_tokens),
        },
    }
    for name, (block, scale) in METRIC_BLOCKS.items():
        figures = _successful(metrics, name)
        if figures:
            document[block] = _distribution(figures, scale)
    started = number(benchmark.get("start_time"))
    document["meta"] = {
        "model": backend.get("model"),
        "target": backend.get("target"),
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat() if started else None,
        "load_spec": _load(strategy, backend, source),
        "tool": TOOL,
        "tool_version": version,
        "strategy": _strategy_name(strategy),
        "simulated": False,  # the file does not say what served the requests
    }
    warnings = broken_run_warning(f"this guidellm benchmark ({_strategy_name(strategy)})", completed, failed)
    document["warnings"] = warnings
    return RunResult(records=[], summary=RunSummary.from_partial(document))


def from_guidellm(data: JSONObject) -> list[RunResult]:
    """Every benchmark of the file as a run, in the file's order."""
    benchmarks = objects(data, "benchmarks")
    if not benchmarks:
        raise UserError("this guidellm file holds no benchmark (the run stopped before its first one ended); re-run guidellm")
    version = mapping(data, "metadata").get("guidellm_version")
    return [_one(benchmark, None if version is None else str(version), _data_source(data)) for benchmark in benchmarks]


def _data_source(data: JSONObject) -> JSONObject:
    """The run's first data source (`config.spec.data[0]`: kind, prompt_tokens, output_tokens), or {}."""
    config = mapping(data, "config")
    spec = mapping(config, "spec")
    sources = spec.get("data")
    first = sources[0] if isinstance(sources, list) and sources else None
    return first if isinstance(first, dict) else {}
