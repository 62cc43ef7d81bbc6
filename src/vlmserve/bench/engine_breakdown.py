"""The run-level TTFT breakdown from the engine's own histograms: always there, no tracing needed.

vLLM observes, per request, its time to first token (arrival in the API server's engine client
to the first token leaving the engine), the time in the scheduler's queue, and prefill (first
scheduled to first token, vision encoder included). The bench scrapes /metrics before and after
a run; the deltas of each histogram's sum and count give the run's means. What the engine's TTFT
holds beyond queue and prefill is its frontend: input processing (the image processor), the
hand-over to the engine core and the first token's way back. Per request and per request type
the same parts come from the engine's trace spans (bench.engine_traces, results.breakdown).
"""

from __future__ import annotations

from vlmserve import vllm_names
from vlmserve.results.blocks import EngineBreakdown

HISTOGRAMS: dict[str, str] = {
    "ttft": vllm_names.TIME_TO_FIRST_TOKEN,
    "queue": vllm_names.REQUEST_QUEUE_TIME,
    "prefill": vllm_names.REQUEST_PREFILL_TIME,
}
"""The histograms whose _sum and _count deltas give the breakdown's means."""

SAMPLE_NAMES: tuple[str, ...] = tuple(f"{name}{end}" for name in HISTOGRAMS.values() for end in ("_sum", "_count"))


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    if name not in before or name not in after:
        return None
    return after[name] - before[name]


def _mean_ms(before: dict[str, float], after: dict[str, float], name: str) -> tuple[float | None, int]:
    total, count = _delta(before, after, f"{name}_sum"), _delta(before, after, f"{name}_count")
    if total is None or not count:
        return None, int(count or 0)
    return total / count * 1000.0, int(count)


def engine_breakdown(before: dict[str, float], after: dict[str, float]) -> EngineBreakdown | None:
    """Mean engine TTFT, queue, prefill and frontend (TTFT − queue − prefill) in ms; None without the histograms.

    The counts differ a little when requests were in flight at a scrape: TTFT is observed at the
    first token, queue and prefill when a request finishes.
    """
    means: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for part, name in HISTOGRAMS.items():
        means[part], counts[part] = _mean_ms(before, after, name)
    if means["ttft"] is None:
        return None
    ttft, queue, prefill = means["ttft"], means["queue"], means["prefill"]
    frontend = ttft - queue - prefill if queue is not None and prefill is not None else None
    return EngineBreakdown(
        source="engine /metrics histograms (run means)",
        ttft_ms=ttft,
        queue_ms=queue,
        prefill_ms=prefill,
        frontend_ms=frontend,
        requests=counts["ttft"],
        queue_requests=counts["queue"],
        prefill_requests=counts["prefill"],
    )
