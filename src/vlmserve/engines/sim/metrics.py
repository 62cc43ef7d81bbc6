"""/metrics for the sim engine: vLLM V1's metric names, types, labels and buckets.

Names, label names (`model_name`, `engine`) and bucket boundaries follow vLLM's
`vllm/v1/metrics/loggers.py` and `buckets.py`, so dashboards, alert rules and the
gateway's load polling work unchanged against a sim engine. Each engine has its own
registry (several engines can live in one test process).

Per-token observations (inter-token latency) arrive thousands of times a second, so
they go through `BatchedHistogram`, which takes a whole step's values in one call.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from vlmserve import vllm_names as names

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
LABEL_NAMES = ("model_name", "engine")

disable_created_metrics()  # vLLM does too: no *_created series


class BatchedHistogram(Collector):
    """A Prometheus histogram fed many values at once (exposes the usual _bucket/_sum/_count)."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], label_values: Sequence[str]):
        self.name = name
        self.documentation = documentation
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.label_values = list(label_values)

    def observe_many(self, values: Iterable[float]) -> None:
        bounds = self.bounds
        counts = self.counts
        total = 0.0
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value
        self.total += total

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(LABEL_NAMES))
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts):
            cumulative += count
            buckets.append((repr(float(bound)), cumulative))
        cumulative += self.counts[-1]
        buckets.append(("+Inf", cumulative))
        family.add_metric(self.label_values, buckets, self.total)
        yield family


class _WithLora(Protocol):
    """A request as the LoRA gauge reads it: the adapter it asked for, if any."""

    @property
    def lora(self) -> str | None: ...


class EngineMetrics:
    """The sim engine's Prometheus metrics, labelled as vLLM labels them."""

    def __init__(self, model_name: str, engine_index: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.lora_info: Gauge | None = None
        labels = (model_name, str(engine_index))
        registry = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABEL_NAMES, registry=registry, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABEL_NAMES, registry=registry)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, LABEL_NAMES, registry=registry, buckets=buckets)

        self.num_requests_running = gauge(names.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.").labels(
            *labels
        )
        self.num_requests_waiting = gauge(names.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.").labels(
            *labels
        )
        self.kv_cache_usage = gauge(names.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.").labels(*labels)
        self.prefix_cache_queries = counter(
            names.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens."
        ).labels(*labels)
        self.prefix_cache_hits = counter(
            names.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*labels)
        self.mm_cache_queries = counter(
            names.MM_CACHE_QUERIES, "Multi-modal cache queries, in terms of number of queried items."
        ).labels(*labels)
        self.mm_cache_hits = counter(names.MM_CACHE_HITS, "Multi-modal cache hits, in terms of number of cached items.").labels(
            *labels
        )
        self.num_preemptions = counter(names.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.").labels(*labels)
        self.prompt_tokens = counter(names.PROMPT_TOKENS, "Number of prefill tokens processed.").labels(*labels)
        self.generation_tokens = counter(names.GENERATION_TOKENS, "Number of generation tokens processed.").labels(*labels)
        success = Counter(
            names.REQUEST_SUCCESS, "Count of successfully processed requests.",
            LABEL_NAMES + ("finished_reason",), registry=registry,
        )  # fmt: skip
        self.request_success = {reason: success.labels(*labels, reason) for reason in FINISH_REASONS}
        self.time_to_first_token = histogram(
            names.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", TIME_TO_FIRST_TOKEN_BUCKETS
        ).labels(*labels)
        self.e2e_request_latency = histogram(
            names.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        ).labels(*labels)
        self.request_queue_time = histogram(
            names.REQUEST_QUEUE_TIME, "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS
        ).labels(*labels)
        self.request_prefill_time = histogram(
            names.REQUEST_PREFILL_TIME, "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS
        ).labels(*labels)
        self.request_prompt_tokens = histogram(
            names.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", _token_buckets()
        ).labels(*labels)
        self.request_generation_tokens = histogram(
            names.REQUEST_GENERATION_TOKENS, "Number of generation tokens processed.", _token_buckets()
        ).labels(*labels)
        self.inter_token_latency = BatchedHistogram(
            names.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS, labels,
        )  # fmt: skip
        registry.register(self.inter_token_latency)

    def bind_state(self, running: Callable[[], float], waiting: Callable[[], float], kv_usage: Callable[[], float]) -> None:
        """Read the scheduler's state at scrape time (always current, no per-step cost)."""
        self.num_requests_running.set_function(running)
        self.num_requests_waiting.set_function(waiting)
        self.kv_cache_usage.set_function(kv_usage)

    def set_lora_info(self, max_loras: int, running: Iterable[_WithLora], waiting: Iterable[_WithLora]) -> None:
        """vLLM's LoRA gauge: labels max_lora and the adapters with requests running / waiting, value the time now."""
        if self.lora_info is None:
            self.lora_info = Gauge(
                names.LORA_REQUESTS_INFO,
                "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=self.registry,
            )
        self.lora_info.clear()  # vLLM keeps old label sets (older timestamps); one current set reads the same
        adapters = [",".join(sorted({r.lora for r in group if r.lora})) for group in (waiting, running)]
        self.lora_info.labels(str(max_loras), *adapters).set(time.time())

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _token_buckets() -> list[float]:
    """vLLM's 1-2-5 series up to a generous max_model_len."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > 131072:
                return buckets
            buckets.append(float(value))
        exponent += 1
