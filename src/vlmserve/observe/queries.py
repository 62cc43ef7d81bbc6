"""The one table of PromQL queries behind the dashboards, the alert rules and their tests.

Metric names follow what vLLM V1 exports today (`vllm/v1/metrics/loggers.py`): counters
gain `_total` when scraped, histograms are read through `_bucket`, and per-token latency is
`vllm:inter_token_latency_seconds` (the old `vllm:time_per_output_token_seconds` is gone —
dashboards that still use it show nothing). Gateway names come from `vlmserve.gateway`.

Each expression carries a `{window}` placeholder for the rate window: Grafana gets
`$__rate_interval`, alert rules get a fixed window (5m by default), tests a short one.
Ratios and error counts fall back to zero-valued series so that "no errors yet" reads as 0,
not as "no data".
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINE_JOB = "vlmserve-engines"
"""Prometheus job name for the engine replicas (scrape config, ServiceMonitor, `up` queries)."""
GATEWAY_JOB = "vlmserve-gateway"
"""Prometheus job name for the gateway."""

# --- vLLM engine metrics (as scraped) ---
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"
VLLM_PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_HITS = "vllm:prefix_cache_hits_total"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"

# --- vlmserve gateway metrics (as scraped; see vlmserve/gateway/metrics.py) ---
GW_REQUESTS = "vlmserve_gateway_requests_total"  # labels: status, tenant, replica
GW_TTFT = "vlmserve_gateway_time_to_first_token_seconds"  # labels: replica
GW_E2E = "vlmserve_gateway_e2e_request_latency_seconds"  # labels: replica
GW_IN_FLIGHT = "vlmserve_gateway_in_flight"  # labels: replica
GW_OUTSTANDING_TOKENS = "vlmserve_gateway_outstanding_tokens"  # labels: replica
GW_QUEUED = "vlmserve_gateway_queued"  # labels: priority
GW_SHED = "vlmserve_gateway_shed_requests_total"  # labels: tenant, reason
GW_RETRIES = "vlmserve_gateway_retries_total"  # labels: replica, reason
GW_REPLICA_HEALTHY = "vlmserve_gateway_replica_healthy"  # labels: replica

@dataclass(frozen=True)
class Query:
    """One PromQL expression with how to show it."""

    expr: str
    legend: str

    def render(self, window: str) -> str:
        """The expression with its rate window filled in (e.g. '5m', '$__rate_interval')."""
        return self.expr.replace("{window}", window)


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: a title, a unit Grafana understands, and its queries."""

    key: str
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


def quantile(q: float, histogram: str, by: str = "") -> Query:
    """p-quantile of a histogram over the window, optionally split by labels."""
    labels = f"le, {by}" if by else "le"
    legend = f"p{_percent(q)}" + (f" {{{{{by}}}}}" if by else "")
    return Query(f"histogram_quantile({q}, sum by ({labels}) (rate({histogram}_bucket[{{window}}])))", legend)


def _percent(q: float) -> str:
    text = f"{q * 100:g}"
    return text.replace(".", "")


def rate_by(counter: str, by: str, selector: str = "", *, zero_fill: bool = False) -> Query:
    """Per-second rate of a counter split by labels; zero_fill keeps a 0 series when nothing matched."""
    expr = f"sum by ({by}) (rate({counter}{selector}[{{window}}]))"
    if zero_fill and selector:
        expr = f"{expr} or (0 * sum by ({by}) (rate({counter}[{{window}}])))"
    return Query(expr, " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(",")))


def gauge_by(gauge: str, by: str, how: str = "sum") -> Query:
    return Query(f"{how} by ({by}) ({gauge})", f"{{{{{by}}}}}")


def _latency_panel(key: str, title: str, histogram: str) -> Panel:
    return Panel(
        key,
        title,
        "s",
        (quantile(0.5, histogram), quantile(0.95, histogram), quantile(0.99, histogram),
         quantile(0.95, histogram, "instance")),
        "Percentiles from the histogram over the rate window; the last series is p95 per replica.",
    )


ENGINE_PANELS: tuple[Panel, ...] = (
    Panel("engine_requests", "Finished requests per second (by replica, reason)", "reqps",
          (rate_by(VLLM_REQUEST_SUCCESS, "instance, finished_reason"),)),
    Panel("engine_queue", "Running and waiting requests", "short",
          (Query(f"sum by (instance) ({VLLM_RUNNING})", "running {{instance}}"),
           Query(f"sum by (instance) ({VLLM_WAITING})", "waiting {{instance}}"))),
    _latency_panel("engine_ttft", "Time to first token", VLLM_TTFT),
    _latency_panel("engine_itl", "Inter-token latency", VLLM_ITL),
    _latency_panel("engine_e2e", "End-to-end request latency", VLLM_E2E),
    Panel("engine_queue_time", "Time waiting in the engine queue (p95)", "s",
          (quantile(0.95, VLLM_QUEUE_TIME, "instance"),)),
    Panel("engine_throughput", "Tokens per second", "short",
          (Query(f"sum by (instance) (rate({VLLM_PROMPT_TOKENS}[{{window}}]))", "prompt {{instance}}"),
           Query(f"sum by (instance) (rate({VLLM_GENERATION_TOKENS}[{{window}}]))", "generated {{instance}}"))),
    Panel("engine_kv_cache", "KV-cache usage", "percentunit",
          (gauge_by(VLLM_KV_USAGE, "instance", "max"),)),
    Panel("engine_prefix_cache", "Prefix-cache hit rate", "percentunit",
          (Query(f"sum by (instance) (rate({VLLM_PREFIX_HITS}[{{window}}])) / "
                 f"clamp_min(sum by (instance) (rate({VLLM_PREFIX_QUERIES}[{{window}}])), 1e-9)",
                 "{{instance}}"),),
          "Share of prompt tokens found in the prefix cache (0 when nothing was queried)."),
    Panel("engine_preemptions", "Preemptions per second", "short",
          (rate_by(VLLM_PREEMPTIONS, "instance"),)),
    Panel("engine_errors", "Aborted requests per second", "reqps",
          (rate_by(VLLM_REQUEST_SUCCESS, "instance", '{finished_reason="abort"}', zero_fill=True),),
          "Requests the engine finished with reason 'abort' (client gone, errors)."),
    Panel("engine_up", "Replicas up", "short",
          (Query(f'up{{job="{ENGINE_JOB}"}}', "{{instance}}"),)),
)

GATEWAY_ERROR_RATIO = Query(
    f'(sum(rate({GW_REQUESTS}{{status=~"5.."}}[{{window}}])) or vector(0)) / '
    f"clamp_min(sum(rate({GW_REQUESTS}[{{window}}])), 1e-9)",
    "5xx share",
)
GATEWAY_SHED_RATE = Query(f"sum(rate({GW_SHED}[{{window}}])) or vector(0)", "shed/s")

GATEWAY_PANELS: tuple[Panel, ...] = (
    Panel("gateway_requests", "Requests per second (by status)", "reqps",
          (rate_by(GW_REQUESTS, "status"),)),
    Panel("gateway_requests_replica", "Requests per second (by replica)", "reqps",
          (rate_by(GW_REQUESTS, "replica"),)),
    Panel("gateway_requests_tenant", "Requests per second (by tenant, status)", "reqps",
          (rate_by(GW_REQUESTS, "tenant, status"),)),
    _latency_panel("gateway_ttft", "Time to first byte at the gateway", GW_TTFT),
    _latency_panel("gateway_e2e", "Request duration at the gateway", GW_E2E),
    Panel("gateway_load", "In flight per replica and queued per priority", "short",
          (Query(f"sum by (replica) ({GW_IN_FLIGHT})", "in flight {{replica}}"),
           Query(f"sum by (priority) ({GW_QUEUED})", "queued {{priority}}"))),
    Panel("gateway_outstanding_tokens", "Outstanding tokens per replica", "short",
          (gauge_by(GW_OUTSTANDING_TOKENS, "replica"),)),
    Panel("gateway_errors", "Error share (5xx)", "percentunit", (GATEWAY_ERROR_RATIO,)),
    Panel("gateway_shed", "Requests shed by admission control", "reqps",
          (GATEWAY_SHED_RATE, rate_by(GW_SHED, "tenant, reason"))),
    Panel("gateway_retries", "Retries on another replica", "reqps",
          (Query(f"sum(rate({GW_RETRIES}[{{window}}])) or vector(0)", "retries/s"),)),
    Panel("gateway_replicas", "Replicas healthy (gateway view)", "short",
          (gauge_by(GW_REPLICA_HEALTHY, "replica", "max"),)),
)

def all_panels() -> tuple[Panel, ...]:
    return ENGINE_PANELS + GATEWAY_PANELS
