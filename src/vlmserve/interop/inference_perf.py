"""inference-perf's report JSON (`summary_lifecycle_metrics.json` or `stage_N_lifecycle_metrics.json`).

Latencies are in seconds (`successes.latency.<metric>` with `mean`, `median`, `p90`...);
throughput in `successes.throughput`. The report names neither the model nor the load: those
are in the `config.yaml` inference-perf writes beside it, read when it is there (model, API,
the stage's rate); without it they stay unknown. A stage file also says its requested rate.

inference-perf counts output tokens by re-tokenising the text unless told to use the server's
count (`report.request_lifecycle.use_server_output_tokens`); when the report shows the two
disagree (`token_count_mismatches`), the import says so in one warning.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from vlmserve.bounded_read import CONFIG_FILE, Refused, read_bytes, yaml_shape
from vlmserve.interop.fields import broken_run_warning, count, mapping, number, objects
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.results.metrics import PERCENTILES
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary

TOOL = "inference-perf"

METRIC_BLOCKS: dict[str, str] = {
    "time_to_first_token": "ttft_ms",
    "time_per_output_token": "tpot_ms",
    "inter_token_latency": "itl_ms",
    "request_latency": "e2e_ms",
}

CONFIG_NAME = "config.yaml"
"""The run's configuration inference-perf writes beside its reports."""


def looks_like_inference_perf(data: JSONValue) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("successes"), dict)
        and "failures" in data
        and "benchmark_time_seconds" in data
    )


def _distribution(block: JSONObject) -> dict[str, float | None]:
    values = {
        "mean": block.get("mean"),
        "min": block.get("min"),
        "max": block.get("max"),
        **{key: block.get(f"p{PERCENTILES[key]:g}") for key in PERCENTILES},
    }
    values["p50"] = block.get("median", values.get("p50"))
    seconds = {key: number(value) for key, value in values.items()}
    return {key: None if value is None else value * 1000.0 for key, value in seconds.items()}


def _config_beside(path: Path | None) -> JSONObject:
    """The run's config.yaml next to the report, or {} (absent, unreadable, over the config-file
    bounds, not YAML): the config is optional, the report imports without it."""
    if path is None:
        return {}
    try:
        text = read_bytes(path.parent / CONFIG_NAME, CONFIG_FILE).decode("utf-8")
        yaml_shape(text, CONFIG_FILE)
        loaded = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, Refused, yaml.YAMLError, RecursionError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _load(config: JSONObject, data: JSONObject) -> JSONObject:
    api = mapping(config, "api")
    load_config = mapping(config, "load")
    stages = objects(load_config, "stages")
    their_load = mapping(data, "load_summary")  # inference-perf's own block, not a RunSummary
    rate = their_load.get("requested_rate")
    if rate is None and len(stages) == 1:
        rate = stages[0].get("rate")
    api_type = api.get("type")
    data_config = mapping(config, "data")
    lengths = {
        ours: number(mapping(data_config, theirs).get("mean"))
        for ours, theirs in (("input_len", "input_distribution"), ("output_len", "output_distribution"))
    }
    load = {
        "rate": number(rate),
        "api": {"completion": "completions", "chat": "chat"}.get(str(api_type)),
        **{key: round(value) for key, value in lengths.items() if value is not None},
        "dataset": data_config.get("type"),
    }
    return {key: value for key, value in load.items() if value is not None}


def _token_warning(successes: JSONObject) -> list[str]:
    mismatches = number(successes.get("token_count_mismatches")) or 0.0
    if not mismatches:
        return []
    lengths = mapping(successes, "output_len")
    served = mapping(successes, "output_tokens")
    client, server = number(lengths.get("mean")), number(served.get("mean"))
    counts = (
        f" ({client:.1f} output tokens per request by its count, {server:.1f} by the server's)"
        if client is not None and server is not None
        else ""
    )
    return [
        f"inference-perf's token counts disagree with the server's on {mismatches:.0f} requests{counts}: "
        "its output tokens/s and TPOT follow its own re-tokenisation"
    ]


def from_inference_perf(data: JSONObject, path: Path | None = None) -> RunResult:
    """The report as a RunResult without records; model and load from the config.yaml beside it."""
    successes = mapping(data, "successes")
    failures = mapping(data, "failures")
    completed, failed = count(successes.get("count")), count(failures.get("count"))
    latency = mapping(successes, "latency")
    throughput = mapping(successes, "throughput")
    prompt = mapping(successes, "prompt_tokens")
    output = mapping(successes, "output_tokens")
    document: dict[str, object] = {
        "requests": {"total": completed + failed, "completed": completed, "failed": failed},
        "duration_s": number(data.get("benchmark_time_seconds")),
        "throughput": {
            "requests_per_s": number(throughput.get("requests_per_sec")),
            "output_tokens_per_s": number(throughput.get("output_tokens_per_sec")),
            "input_tokens_per_s": number(throughput.get("input_tokens_per_sec")),
            "total_tokens_per_s": number(throughput.get("total_tokens_per_sec")),
        },
        "tokens": {"prompt_total": _whole(prompt.get("total")), "output_total": _whole(output.get("total"))},
    }
    for name, block in METRIC_BLOCKS.items():
        if isinstance(latency.get(name), dict):
            document[block] = _distribution(mapping(latency, name))
    config = _config_beside(path)
    server = mapping(config, "server")
    document["meta"] = {
        "model": server.get("model_name"),
        "target": server.get("base_url"),
        "load_spec": _load(config, data),
        "tool": TOOL,
        "simulated": False,  # the report does not say what served the requests
    }
    warnings = _token_warning(successes) + broken_run_warning("this inference-perf report", completed, failed)
    document["warnings"] = warnings
    return RunResult(records=[], summary=RunSummary.from_partial(document))


def _whole(value: JSONValue) -> int | None:
    figure = number(value)
    return None if figure is None else round(figure)
