"""The `vllm bench serve --save-result` JSON, both ways: vlmserve runs out, vLLM results in.

Written so scripts and dashboards that read vLLM's result files take vlmserve's runs unchanged:
the same keys, units and types as vLLM's `benchmarks/serve.py` (seconds for durations and
per-request lists, milliseconds for the `mean_/median_/std_/pNN_<metric>_ms` figures, `request_rate`
the string "inf" for a closed loop). The figures come from vlmserve's one set of metric
definitions (`bench.metrics`); vLLM's differ only in ITL (vLLM: per chunk; vlmserve: per token).

Read back, a file saved with `--save-detailed` gives one RequestRecord per request
(start time, TTFT, the chunk gaps, latency, lengths, error), so the figures, CDFs and
timelines are recomputed here like any run's; a plain file has only vLLM's aggregate
figures, kept as the summary, with no records.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from vlmserve.bounded_read import printable
from vlmserve.errors import UserError
from vlmserve.interop.fields import broken_run_warning
from vlmserve.results.blocks import RunMeta
from vlmserve.results.metrics import PERCENTILES, summarize
from vlmserve.results.records import RequestRecord
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary

TOOL = "vllm bench serve"

METRIC_BLOCKS: dict[str, str] = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
"""vLLM's metric name -> the vlmserve summary block with the same definition."""

REQUIRED_KEYS = ("duration", "completed", "request_throughput", "output_throughput")
"""Keys every `vllm bench serve` result file has; a file without them is not one."""

DATE_FORMAT = "%Y%m%d-%H%M%S"


def _percentile_word(key: str) -> str:
    """vlmserve's 'p999' -> vLLM's '99.9' (as `metric_percentiles` names it)."""
    return f"{PERCENTILES[key]:g}"


def to_vllm_result(result: RunResult) -> dict[str, object]:
    """A vlmserve run as the dict `vllm bench serve --save-result --save-detailed` writes."""
    summary, meta = result.summary, result.meta
    load = meta.load_spec or {}
    requests, throughput, tokens = summary.requests, summary.throughput, summary.tokens
    started = meta.started_at
    try:
        date = datetime.fromisoformat(str(started)).strftime(DATE_FORMAT) if started else None
    except ValueError:
        date = None
    backend = "openai-chat" if load.get("api", "chat") == "chat" else "openai"
    rate = load.get("rate")
    measured = [record for record in result.records if not record.warmup]
    out: dict[str, object] = {
        "date": date or datetime.now().strftime(DATE_FORMAT),
        "endpoint_type": backend,
        "backend": backend,
        "label": meta.label,
        "model_id": meta.model,
        "tokenizer_id": load.get("tokenizer") or meta.model,
        "num_prompts": requests.total,
        "request_rate": rate if rate is not None else "inf",
        "burstiness": load.get("burstiness", 1.0),
        "max_concurrency": load.get("concurrency"),
        "duration": summary.duration_s,
        "completed": requests.completed,
        "failed": requests.failed,
        "total_input_tokens": tokens.prompt_total,
        "total_output_tokens": tokens.output_total,
        "request_throughput": throughput.requests_per_s,
        "request_goodput": summary.figure("goodput.requests_per_s"),
        "output_throughput": throughput.output_tokens_per_s,
        "total_token_throughput": throughput.total_tokens_per_s,
        "input_lens": [record.prompt_tokens or 0 for record in measured],
        "output_lens": [record.output_tokens or 0 for record in measured],
        "ttfts": [record.ttft_s or 0.0 for record in measured],
        "itls": [np.diff(record.chunk_times_s).tolist() if len(record.chunk_times_s) > 1 else [] for record in measured],
        "latencies": [record.e2e_s or 0.0 for record in measured],
        "start_times": [record.sent_at_s for record in measured],
        "generated_texts": ["" for _ in measured],  # vlmserve does not keep answers
        "errors": ["" if record.ok else (record.error_message or record.error_kind or "error") for record in measured],
        "queue_times": [max(record.send_lag_s, 0.0) for record in measured],
        "max_output_tokens_per_s": _peak_tokens_per_s(measured),
        "max_concurrent_requests": _peak_in_flight(measured),
        "rtfx": 0.0,  # vLLM's speech-to-text figure; no meaning here
    }
    for name, block in METRIC_BLOCKS.items():
        figures = summary.latency(block)
        out[f"mean_{name}_ms"] = figures.mean
        out[f"median_{name}_ms"] = figures.p50
        out[f"std_{name}_ms"] = figures.std
        for key in PERCENTILES:
            out[f"p{_percentile_word(key)}_{name}_ms"] = figures.stat(key)
    return out


def _peak_tokens_per_s(records: list[RequestRecord]) -> float:
    """The most output tokens that arrived within one whole second of the run (vLLM's max_output_tokens_per_s)."""
    arrivals = [
        (moment, tokens)
        for record in records
        if record.ok
        for moment, tokens in zip(record.chunk_times_s, record.chunk_tokens or [1] * len(record.chunk_times_s))
    ]
    if not arrivals:
        return 0.0
    origin = min(record.sent_at_s for record in records)
    seconds = ((np.asarray([moment for moment, _ in arrivals]) - origin) // 1.0).astype(int)
    return float(np.bincount(seconds, weights=[tokens for _, tokens in arrivals]).max())


def _peak_in_flight(records: list[RequestRecord]) -> int:
    """The most requests sent and not yet finished at one moment."""
    events = sorted(
        [(record.sent_at_s, 1) for record in records] + [(record.finished_at_s or record.sent_at_s, -1) for record in records],
        key=lambda e: (e[0], e[1]),
    )
    peak = current = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def write_vllm_result(result: RunResult, path: Path) -> Path:
    """Write the run as a vLLM result file (one JSON object, as vLLM writes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_vllm_result(result)), encoding="utf-8")
    return path


def looks_like_vllm_result(data: object) -> bool:
    return isinstance(data, dict) and all(key in data for key in REQUIRED_KEYS)


def _records(data: dict[str, Any]) -> list[RequestRecord]:
    """One record per request from a `--save-detailed` file; [] when the per-request lists are absent."""
    lists = ("start_times", "ttfts", "itls", "latencies", "input_lens", "output_lens", "errors")
    if not all(isinstance(data.get(name), list) for name in lists):
        return []
    count = len(data["start_times"])
    if any(len(data[name]) != count for name in lists):
        raise UserError(
            "the per-request lists of this vllm bench serve file differ in length; "
            "the file is damaged: re-run vllm bench serve with --save-result --save-detailed"
        )
    records: list[RequestRecord] = []
    for index in range(count):
        sent = float(data["start_times"][index])
        error = data["errors"][index] or ""
        ok = not error
        output_tokens = int(data["output_lens"][index] or 0)
        gaps = [float(gap) for gap in data["itls"][index] or []]
        first = sent + float(data["ttfts"][index]) if ok else None
        chunk_times = [first, *(first + float(total) for total in np.cumsum(gaps))] if first is not None else []
        chunk_tokens = _spread(output_tokens, len(chunk_times))
        records.append(
            RequestRecord(
                request_id=f"vllm-{index}",
                scheduled_at_s=sent,
                sent_at_s=sent,
                first_token_at_s=first,
                finished_at_s=sent + float(data["latencies"][index]) if ok else None,
                chunk_times_s=chunk_times,
                chunk_tokens=chunk_tokens,
                prompt_tokens=int(data["input_lens"][index] or 0),
                output_tokens=output_tokens if ok else None,
                ok=ok,
                error_kind=None if ok else "error",
                error_message=printable(str(error), 500) or None,
            )
        )
    return records


def _spread(tokens: int, chunks: int) -> list[int]:
    """vLLM records chunk gaps, not tokens per chunk: share the output tokens out, at least one each."""
    if chunks == 0:
        return []
    base, extra = divmod(max(tokens, chunks), chunks)
    return [base + (1 if index < extra else 0) for index in range(chunks)]


def _aggregate_summary(data: dict[str, Any]) -> RunSummary:
    """vLLM's own figures as a vlmserve summary (a file saved without --save-detailed)."""
    document: dict[str, object] = {
        "requests": {
            "total": (data.get("completed") or 0) + (data.get("failed") or 0),
            "completed": data.get("completed"),
            "failed": data.get("failed") or 0,
        },
        "duration_s": data.get("duration"),
        "throughput": {
            "requests_per_s": data.get("request_throughput"),
            "output_tokens_per_s": data.get("output_throughput"),
            "total_tokens_per_s": data.get("total_token_throughput"),
        },
        "tokens": {"prompt_total": data.get("total_input_tokens"), "output_total": data.get("total_output_tokens")},
    }
    for name, block in METRIC_BLOCKS.items():
        figures: dict[str, object] = {
            "mean": data.get(f"mean_{name}_ms"),
            "p50": data.get(f"median_{name}_ms"),
            "std": data.get(f"std_{name}_ms"),
        }
        for key in PERCENTILES:
            value = data.get(f"p{_percentile_word(key)}_{name}_ms")
            if value is not None:
                figures[key] = value
        document[block] = figures
    return RunSummary.from_partial(document)


def _finite(value: float, name: str) -> float:
    """A number the file gave as text ("nan", "1e999") is still refused when not finite."""
    if not math.isfinite(value):
        raise ValueError(f"{name} is {value}, not a finite number")
    return value


def _started_at(data: dict[str, Any]) -> str | None:
    try:
        return datetime.strptime(str(data.get("date")), DATE_FORMAT).astimezone().isoformat()
    except ValueError:
        return None


def from_vllm_result(data: dict[str, Any]) -> RunResult:
    """A `vllm bench serve` result file as a RunResult (records when the file is detailed)."""
    records = _records(data)
    summary = summarize(records, None, duration_s=float(data["duration"])) if records else _aggregate_summary(data)
    rate = data.get("request_rate")
    concurrency = data.get("max_concurrency")
    lengths = summary.tokens
    completed = data.get("completed") or 0
    load: dict[str, object] = {
        "concurrency": concurrency if rate in (None, "inf") else None,
        "rate": None if rate in (None, "inf") else _finite(float(rate), "request_rate"),
        "input_len": round(lengths.prompt_total / completed) if completed else None,
        "output_len": round(lengths.output_total / completed) if completed else None,
        "api": "chat" if str(data.get("backend", "")).endswith("chat") else "completions",
    }
    summary.meta = RunMeta.model_validate(
        {
            "label": data.get("label") or None,
            "model": data.get("model_id"),
            "started_at": _started_at(data),
            "load_spec": {key: value for key, value in load.items() if value is not None},
            "tool": TOOL,
            "simulated": False,
        }
    )
    summary.warnings = [
        *(summary.warnings or []),
        *broken_run_warning("this vllm bench serve file", int(completed), int(data.get("failed") or 0)),
    ]
    return RunResult(records=records, summary=summary)
