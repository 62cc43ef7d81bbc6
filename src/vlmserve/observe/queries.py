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

from vlmserve import vllm_names

ENGINE_JOB = "vlmserve-engines"
"""Prometheus job name for the engine replicas (scrape config, ServiceMonitor, `up` queries)."""
GATEWAY_JOB = "vlmserve-gateway"
"""Prometheus job name for the gateway."""

# --- vLLM engine metrics (as scraped) ---
VLLM_RUNNING = vllm_names.NUM_REQUESTS_RUNNING
VLLM_WAITING = vllm_names.NUM_REQUESTS_WAITING
VLLM_KV_USAGE = vllm_names.KV_CACHE_USAGE
VLLM_PREFIX_QUERIES = vllm_names.total(vllm_names.PREFIX_CACHE_QUERIES)
VLLM_PREFIX_HITS = vllm_names.total(vllm_names.PREFIX_CACHE_HITS)
VLLM_PREEMPTIONS = vllm_names.total(vllm_names.NUM_PREEMPTIONS)
VLLM_PROMPT_TOKENS = vllm_names.total(vllm_names.PROMPT_TOKENS)
VLLM_GENERATION_TOKENS = vllm_names.total(vllm_names.GENERATION_TOKENS)
VLLM_REQUEST_SUCCESS = vllm_names.total(vllm_names.REQUEST_SUCCESS)
VLLM_TTFT = vllm_names.TIME_TO_FIRST_TOKEN
VLLM_ITL = vllm_names.INTER_TOKEN_LATENCY
VLLM_E2E = vllm_names.E2E_REQUEST_LATENCY
VLLM_QUEUE_TIME = vllm_names.REQUEST_QUEUE_TIME

# --- vlmserve gateway metrics (as scraped; see vlmserve/gateway/metrics.py) ---
GW_REQUESTS = "vlmserve_gateway_requests_total"  # labels: status, tenant, replica
GW_TTFT = "vlmserve_gateway_time_to_first_token_seconds"  # labels: replica, route (generation routes only)
GW_E2E = "vlmserve_gateway_e2e_request_latency_seconds"  # labels: replica, route
GW_IN_FLIGHT = "vlmserve_gateway_in_flight"  # labels: replica
GW_OUTSTANDING_TOKENS = "vlmserve_gateway_outstanding_tokens"  # labels: replica
GW_QUEUED = "vlmserve_gateway_queued"  # labels: priority
GW_SHED = "vlmserve_gateway_shed_requests_total"  # labels: tenant, reason
GW_RETRIES = "vlmserve_gateway_retries_total"  # labels: replica, reason
GW_REPLICA_HEALTHY = "vlmserve_gateway_replica_healthy"  # labels: replica

DEPLOYMENT_LABEL = "deployment"
"""Set on every target by the scrape config (`scrape.py`, the ServiceMonitor's relabeling): which deployment."""
MODEL_LABEL = "model_name"
"""vLLM's label on every engine metric: the served model."""

_SCOPE_MARK = "<scope:{}>"
"""Where a label filter may go in a selector; `Query.render` fills it in or drops it."""

GW_SERVER_FAILED = "5..|stream_error"
"""Gateway `status` values that are the server's fault: a 5xx answer, or a stream that broke after
its 200 header (the gateway records those as `stream_error`, see gateway/proxy.py). `abandoned`
(the client left) and 4xx are not."""


def sel(metric: str, matchers: str = "", *, scoped_by: tuple[str, ...] = (DEPLOYMENT_LABEL,)) -> str:
    """A vector selector that dashboards can narrow to one deployment (and model), alerts leave whole."""
    marks = "".join(_SCOPE_MARK.format(label) for label in scoped_by)
    return f"{metric}{{{marks}{matchers}}}"


def vllm_sel(metric: str, matchers: str = "") -> str:
    """A selector of an engine metric: narrowed by deployment and by model."""
    return sel(metric, matchers, scoped_by=(DEPLOYMENT_LABEL, MODEL_LABEL))


def scoped_labels(expr: str) -> set[str]:
    """The labels an expression can be narrowed by (each becomes a dashboard variable)."""
    return {label for label in (DEPLOYMENT_LABEL, MODEL_LABEL) if _SCOPE_MARK.format(label) in expr}


@dataclass(frozen=True)
class Query:
    """One PromQL expression with how to show it."""

    expr: str
    legend: str

    def render(self, window: str, filters: dict[str, str] | None = None) -> str:
        """The expression with its rate window (e.g. '5m', '$__rate_interval') and label filters filled in.

        `filters` maps a label to the regex it must match (dashboards pass their variables);
        selectors without a filter are left whole (`metric{}` becomes `metric`).
        """
        text = self.expr.replace("{window}", window)
        for label in (DEPLOYMENT_LABEL, MODEL_LABEL):
            value = (filters or {}).get(label)
            text = text.replace(_SCOPE_MARK.format(label), f'{label}=~"{value}",' if value is not None else "")
        return text.replace("{}", "").replace(",}", "}")


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: a title, a unit Grafana understands, and its queries."""

    key: str
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


def _legend(by: str) -> str:
    return " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))


def quantile(q: float, histogram_selector: str, by: str = "") -> Query:
    """p-quantile of a histogram over the window, optionally split by labels.

    `histogram_selector` is `sel(name + "_bucket")` or `vllm_sel(...)`, so the buckets are scoped.
    """
    labels = f"le, {by}" if by else "le"
    legend = f"p{_percent(q)}" + (f" {_legend(by)}" if by else "")
    return Query(f"histogram_quantile({q}, sum by ({labels}) (rate({histogram_selector}[{{window}}])))", legend)


def _percent(q: float) -> str:
    text = f"{q * 100:g}"
    return text.replace(".", "")


def rate_by(counter_selector: str, by: str, subset_selector: str | None = None) -> Query:
    """Per-second rate of a counter split by labels.

    With `subset_selector` (e.g. the counter narrowed to one status, or a counter that only
    appears once something happens), the rate of that subset instead, falling back to 0 per
    group while `counter_selector` has data: "none failed" reads as 0, not as "no data".
    """
    whole = f"sum by ({by}) (rate({counter_selector}[{{window}}]))"
    if subset_selector is None:
        return Query(whole, _legend(by))
    subset = f"sum by ({by}) (rate({subset_selector}[{{window}}]))"
    return Query(f"{subset} or (0 * {whole})", _legend(by))


def gauge_by(gauge_selector: str, by: str, how: str = "sum") -> Query:
    return Query(f"{how} by ({by}) ({gauge_selector})", _legend(by))


def _latency_panel(key: str, title: str, buckets: str) -> Panel:
    return Panel(
        key,
        title,
        "s",
        (quantile(0.5, buckets), quantile(0.95, buckets), quantile(0.99, buckets), quantile(0.95, buckets, "instance")),
        "Percentiles from the histogram over the rate window; the last series is p95 per replica.",
    )


ENGINE_PANELS: tuple[Panel, ...] = (
    Panel(
        "engine_requests",
        "Finished requests per second (by replica, reason)",
        "reqps",
        (rate_by(vllm_sel(VLLM_REQUEST_SUCCESS), "instance, finished_reason"),),
    ),
    Panel(
        "engine_queue",
        "Running and waiting requests",
        "short",
        (
            Query(f"sum by (instance) ({vllm_sel(VLLM_RUNNING)})", "running {{instance}}"),
            Query(f"sum by (instance) ({vllm_sel(VLLM_WAITING)})", "waiting {{instance}}"),
        ),
    ),
    _latency_panel("engine_ttft", "Time to first token", vllm_sel(VLLM_TTFT + "_bucket")),
    _latency_panel("engine_itl", "Inter-token latency", vllm_sel(VLLM_ITL + "_bucket")),
    _latency_panel("engine_e2e", "End-to-end request latency", vllm_sel(VLLM_E2E + "_bucket")),
    Panel(
        "engine_queue_time",
        "Time waiting in the engine queue (p95)",
        "s",
        (quantile(0.95, vllm_sel(VLLM_QUEUE_TIME + "_bucket"), "instance"),),
    ),
    Panel(
        "engine_throughput",
        "Tokens per second",
        "short",
        (
            Query(f"sum by (instance) (rate({vllm_sel(VLLM_PROMPT_TOKENS)}[{{window}}]))", "prompt {{instance}}"),
            Query(f"sum by (instance) (rate({vllm_sel(VLLM_GENERATION_TOKENS)}[{{window}}]))", "generated {{instance}}"),
        ),
    ),
    Panel("engine_kv_cache", "KV-cache usage", "percentunit", (gauge_by(vllm_sel(VLLM_KV_USAGE), "instance", "max"),)),
    Panel(
        "engine_prefix_cache",
        "Prefix-cache hit rate",
        "percentunit",
        (
            Query(
                f"sum by (instance) (rate({vllm_sel(VLLM_PREFIX_HITS)}[{{window}}])) / "
                f"clamp_min(sum by (instance) (rate({vllm_sel(VLLM_PREFIX_QUERIES)}[{{window}}])), 1e-9)",
                "{{instance}}",
            ),
        ),
        "Share of prompt tokens found in the prefix cache (0 when nothing was queried).",
    ),
    Panel("engine_preemptions", "Preemptions per second", "short", (rate_by(vllm_sel(VLLM_PREEMPTIONS), "instance"),)),
    Panel(
        "engine_errors",
        "Aborted requests per second",
        "reqps",
        (rate_by(vllm_sel(VLLM_REQUEST_SUCCESS), "instance", vllm_sel(VLLM_REQUEST_SUCCESS, 'finished_reason="abort"')),),
        "Requests the engine finished with reason 'abort' (client gone, errors).",
    ),
    Panel("engine_up", "Replicas up", "short", (Query(sel("up", f'job="{ENGINE_JOB}"'), "{{instance}}"),)),
)

_GW_FAILED_SHARE = rate_by(sel(GW_REQUESTS), DEPLOYMENT_LABEL, sel(GW_REQUESTS, f'status=~"{GW_SERVER_FAILED}"'))
GATEWAY_ERROR_RATIO = Query(
    f"({_GW_FAILED_SHARE.expr}) / clamp_min(sum by ({DEPLOYMENT_LABEL}) (rate({sel(GW_REQUESTS)}[{{window}}])), 1e-9)",
    "failed share",
)
"""Share of the gateway's answers that failed on the server's side (5xx or broken mid-stream), per deployment."""
GATEWAY_SHED_RATE = Query(rate_by(sel(GW_REQUESTS), DEPLOYMENT_LABEL, sel(GW_SHED)).expr, "shed/s")
"""Requests/s refused by admission control, per deployment; 0 while the gateway serves and sheds nothing."""

GATEWAY_PANELS: tuple[Panel, ...] = (
    Panel("gateway_requests", "Requests per second (by status)", "reqps", (rate_by(sel(GW_REQUESTS), "status"),)),
    Panel("gateway_requests_replica", "Requests per second (by replica)", "reqps", (rate_by(sel(GW_REQUESTS), "replica"),)),
    Panel(
        "gateway_requests_tenant",
        "Requests per second (by tenant, status)",
        "reqps",
        (rate_by(sel(GW_REQUESTS), "tenant, status"),),
    ),
    _latency_panel("gateway_ttft", "Time to first byte at the gateway", sel(GW_TTFT + "_bucket")),
    _latency_panel("gateway_e2e", "Request duration at the gateway", sel(GW_E2E + "_bucket")),
    Panel(
        "gateway_load",
        "In flight per replica and queued per priority",
        "short",
        (
            Query(f"sum by (replica) ({sel(GW_IN_FLIGHT)})", "in flight {{replica}}"),
            Query(f"sum by (priority) ({sel(GW_QUEUED)})", "queued {{priority}}"),
        ),
    ),
    Panel(
        "gateway_outstanding_tokens",
        "Outstanding tokens per replica",
        "short",
        (gauge_by(sel(GW_OUTSTANDING_TOKENS), "replica"),),
    ),
    Panel("gateway_errors", "Failed share (5xx or broken mid-stream)", "percentunit", (GATEWAY_ERROR_RATIO,)),
    Panel(
        "gateway_shed",
        "Requests shed by admission control",
        "reqps",
        (GATEWAY_SHED_RATE, rate_by(sel(GW_SHED), "tenant, reason")),
    ),
    Panel(
        "gateway_retries",
        "Retries on another replica",
        "reqps",
        (Query(f"sum(rate({sel(GW_RETRIES)}[{{window}}])) or vector(0)", "retries/s"),),
    ),
    Panel("gateway_replicas", "Replicas healthy (gateway view)", "short", (gauge_by(sel(GW_REPLICA_HEALTHY), "replica", "max"),)),
)


def all_panels() -> tuple[Panel, ...]:
    return ENGINE_PANELS + GATEWAY_PANELS
