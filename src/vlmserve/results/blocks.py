"""The blocks producers attach to a run summary: `meta`, `client`, `server`, `prefix_cache`,
`repeats`, `simulation`, `scaling`, each a declared model.

Every block forbids keys it does not declare (`_Strict`): a producer that misspells a key fails
where it writes it, instead of leaving a silent extra and the real field at its default. A field
is written to the JSON only when a producer set it (`RunSummary.to_dict` dumps with
`exclude_unset`), so a file keeps exactly the keys it was written with and older files round-trip.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from vlmserve.json_types import JSONObject


class _Strict(BaseModel):
    """A declared part of the summary: an unknown key is an error, never a silent extra."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


DISTRIBUTION_STATS: tuple[str, ...] = ("p50", "p90", "p95", "p99", "p999", "mean", "std", "min", "max")


class Distribution(_Strict):
    """One distribution in milliseconds (tokens where the field says so); every statistic None when nothing was measured."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    count: int = 0
    p50_p99_spread: float | None = None
    p99_over_p50: float | None = None

    def stat(self, name: str) -> float | None:
        """A statistic by name (`p95`, `mean`, …), as the SLO keys and figure names spell it."""
        if name not in DISTRIBUTION_STATS:
            raise KeyError(f"unknown statistic {name!r}; one of {', '.join(DISTRIBUTION_STATS)}")
        value = getattr(self, name)
        return None if value is None else float(value)


class EngineTraces(_Strict):
    """`bench --engine-traces`: what the OTLP receiver got and how many records it matched."""

    url: str
    spans_received: int = 0
    records_matched: int = 0
    measured_with_span: int = 0
    measured_answered: int = 0
    exports: int = 0


class RunMeta(_Strict):
    """Who ran what, against what, and how the run ended (bench, planner and imports fill it)."""

    run_id: str | None = None
    label: str | None = None
    target: str | None = None
    model: str | None = None
    server_version: str | None = None
    load_spec: JSONObject | None = None
    """The LoadSpec as JSON (an imported run's: the parts the other tool's file states)."""
    deployment: JSONObject | None = None
    started_at: str | None = None
    simulated: bool = False
    post_run_failed: bool = False
    token_counter: str | None = None
    prompt_lengths_exact: bool | None = None
    per_chunk_usage: bool | None = None
    notices: list[str] | None = None
    slo: dict[str, float] | None = None
    """The run's SLO bounds in seconds (`SLO.bounds_s`)."""
    slo_by_type: dict[str, dict[str, float]] | None = None
    slo_rates: dict[str, float] | None = None
    client_limited: bool | None = None
    interrupted: bool = False
    stopped: str | None = None
    """Why the load ended before its plan (`oversaturated`); None when it ran to the end."""
    stopped_reason: str | None = None
    host_cpus: int | None = None
    engine_traces: EngineTraces | None = None
    simulation_id: str | None = None
    """The planner's runs (plan.simulate)."""
    kv_cache_tokens_per_replica: int | None = None
    tool: str | None = None
    """Imported runs (`runs import`): the tool that made the file, its version, where it came from."""
    tool_version: str | None = None
    strategy: str | None = None
    imported_from: str | None = None
    original_run_id: str | None = None


class ClientCpu(_Strict):
    """CPU of the load generator's processes (bench.clientcpu), keyed by worker index."""

    processes: int = 0
    worker_busy_fraction: dict[str, float] = Field(default_factory=dict)
    worker_peak_busy_fraction: dict[str, float] = Field(default_factory=dict)
    total_cpu_s: float = 0.0
    machine_cores: int = 1


class ClientBlock(_Strict):
    """Send lag, offered vs achieved rate, client CPU, and whether the client limited the run."""

    send_lag_ms: Distribution = Field(default_factory=Distribution)
    offered_rate: float | None = None
    achieved_send_rate: float | None = None
    requests_per_s_sent: float | None = None
    cpu: ClientCpu | None = None
    workers: int | None = None
    in_process: bool | None = None
    limited: bool = False
    limited_reasons: list[str] = Field(default_factory=list)


class EngineBreakdown(_Strict):
    """Mean engine TTFT parts in ms from the engine's /metrics histograms (bench.engine_breakdown)."""

    source: str = ""
    ttft_ms: float | None = None
    queue_ms: float | None = None
    prefill_ms: float | None = None
    frontend_ms: float | None = None
    requests: int = 0
    queue_requests: int = 0
    prefill_requests: int = 0


class ServerBlock(_Strict):
    """Scraped /metrics deltas of the endpoint over the run (bench.scrape)."""

    available: bool = False
    metrics_url: str | None = None
    """What was read: the target's /metrics, and behind a vlmserve gateway its engines' page too ('A + B')."""
    engines_unknown: str | None = None
    """Behind a gateway: why the engines' figures are unknown (e.g. its engines' page needs an admin key)."""
    counters: dict[str, float | None] = Field(default_factory=dict)
    prefix_cache_hit_rate: float | None = None
    mm_cache_hit_rate: float | None = None
    engine_breakdown: EngineBreakdown | None = None
    preemptions: float | None = None
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv_cache_usage: float | None = None
    gauge_samples: int = 0
    replicas_timeline: list[tuple[float, float]] | None = None
    """(seconds since the epoch, replicas) as the gateway reported them; None when it did not."""


class PrefixCacheBlock(_Strict):
    """Expected vs measured prefix-cache hits (bench.prefix_cache)."""

    workload: str
    measured_hit_rate: float | None = None
    expected_hit_rate: float | None = None
    verdict: str = "unknown"
    """"as intended", "above", "below" or "unknown"."""


class ConfidenceInterval(_Strict):
    """Mean and 95 % t-interval of per-repeat values; `low`/`high` None for a single value."""

    mean: float
    low: float | None = None
    high: float | None = None
    half_width: float | None = None
    values: list[float] = Field(default_factory=list)


class RepeatRow(_Strict):
    """One repeat of a `--repeat N` run."""

    repeat: int
    seed: int
    duration_s: float = 0.0
    completed: int = 0
    failed: int = 0
    stopped: str | None = None
    slo_met: bool | None = None
    slo_checks: dict[str, float | None] = Field(default_factory=dict)
    figures: dict[str, float | None] = Field(default_factory=dict)


class RepeatsBlock(_Strict):
    """Per-repeat rows and intervals of a `--repeat N` run (bench.repeats)."""

    count: int
    single_run: bool = False
    method: str | None = None
    confidence: float | None = None
    seeds: list[int] | None = None
    intervals: dict[str, ConfidenceInterval] | None = None
    runs: list[RepeatRow] = Field(default_factory=list)


class SimulatedFrontend(_Strict):
    """The frontend (image preprocessing) as simulated by the planner (plan.simulate)."""

    api_server_count: int
    utilization: float = 0.0
    mean_frontend_s: float = 0.0
    mean_engine_queue_s: float = 0.0
    mm_cache_hit_rate: float = 0.0
    stated_repeat_rate: float | None = None
    per_image_ms: float | None = None
    per_megapixel_ms: float | None = None


class SimulationBlock(_Strict):
    """Engine-side totals of a simulated run (plan.simulate): predicted, not measured."""

    steps: int = 0
    preemptions: int = 0
    max_num_running: int = 0
    max_num_waiting: int = 0
    max_kv_usage: float = 0.0
    kv_blocks_per_replica: int = 0
    busy_s_per_replica: list[float] = Field(default_factory=list)
    frontend: SimulatedFrontend | None = None


class ScalingWindow(_Strict):
    """One window of a `--load-shape` run: requests sent in it, how many met the SLO, the replicas."""

    start_s: float
    requests: int = 0
    met: int = 0
    failed: int = 0
    attainment: float | None = None
    replicas: float | None = None

    @property
    def missed(self) -> bool:
        """Some request sent in the window missed the SLO (or failed)."""
        return bool(self.requests) and self.met < self.requests


class ScaleUp(_Strict):
    """One rise of the replica count: SLO misses while it started and after it."""

    began_s: float
    first_joined_s: float
    last_joined_s: float
    replicas_before: float
    replicas_after: float
    requests_during: int = 0
    missed_during: int = 0
    failed_during: int = 0
    requests_after: int = 0
    missed_after: int = 0
    failed_after: int = 0
    after_until_s: float | None = None


class ScaleDown(_Strict):
    """One fall of the replica count: the requests in flight around it, and how many failed."""

    seen_s: float
    replicas_before: float
    replicas_after: float
    requests_in_flight: int = 0
    failed: int = 0


class ScalingBlock(_Strict):
    """`--load-shape` runs: SLO attainment per window and across each scale event (bench.scale_events)."""

    load_shape: str | None = None
    window_s: float
    slo: dict[str, float] | None = None
    replicas_timeline: list[tuple[float, float]] | None = None
    """(seconds from the first send, replicas in rotation); None when the target is not a vlmserve gateway."""
    windows: list[ScalingWindow] = Field(default_factory=list)
    scale_ups: list[ScaleUp] = Field(default_factory=list)
    scale_downs: list[ScaleDown] = Field(default_factory=list)
    failed_total: int = 0
