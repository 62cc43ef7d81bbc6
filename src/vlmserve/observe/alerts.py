"""Prometheus alert rules for a vlmserve deployment, built from the shared query table.

Each alert is a *signal* query (always returns series while targets are scraped) compared
against a threshold. Keeping the signal separate lets the tests check that every signal has
data in a real Prometheus, while the rule itself only returns series when it fires. The
signal is parenthesised before the comparison: PromQL's `or` binds looser than `>`, so
`a or vector(0) > 0` would compare only the fallback (and fire for ever).

Signals are split by `deployment` (set by the scrape config), so two deployments scraped by
one Prometheus raise separate alerts. tests/e2e/observe/alert_rules_test.yaml checks each rule's
behaviour with `promtool test rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmserve.observe import queries as q


@dataclass(frozen=True)
class AlertSettings:
    """Thresholds an operator tunes; defaults suit an interactive VLM service."""

    ttft_slo_s: float = 0.5
    queue_backlog: int = 10
    kv_cache_full: float = 0.9
    preemptions_per_s: float = 0.5
    error_ratio: float = 0.05
    window: str = "5m"
    for_override: str | None = None
    """Replace every `for:` (tests use 0s so an alert fires at once)."""
    extra_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    name: str
    signal: q.Query
    comparator: str
    threshold: float
    for_: str
    severity: str
    summary: str
    description: str

    def expr(self, window: str) -> str:
        return f"({self.signal.render(window)}) {self.comparator} {self.threshold:g}"


def build_alerts(settings: AlertSettings) -> list[Alert]:
    """The alert list; thresholds from settings, queries from the shared table."""
    return [*_engine_load_alerts(settings), *_down_alerts(), *_gateway_traffic_alerts(settings)]


def _engine_load_alerts(settings: AlertSettings) -> list[Alert]:
    """Per replica: latency over the SLO, a queue, a full KV cache, preemptions."""
    per_replica = f"{q.DEPLOYMENT_LABEL}, instance"
    ttft_p95 = q.quantile(0.95, q.vllm_sel(q.VLLM_TTFT + "_bucket"), per_replica)
    return [
        Alert(
            "VlmserveTTFTAboveSLO",
            ttft_p95,
            ">",
            settings.ttft_slo_s,
            "5m",
            "warning",
            "p95 time to first token above the SLO on {{ $labels.instance }}",
            f"p95 TTFT is {{{{ $value | humanizeDuration }}}} against an SLO of {settings.ttft_slo_s:g}s. "
            "Add replicas, lower max_num_batched_tokens, or shed batch traffic.",
        ),
        Alert(
            "VlmserveQueueBacklog",
            q.gauge_by(q.vllm_sel(q.VLLM_WAITING), per_replica),
            ">",
            settings.queue_backlog,
            "5m",
            "warning",
            "Requests piling up in the engine queue on {{ $labels.instance }}",
            "{{ $value }} requests waiting. The replica is saturated; scale out or admit less.",
        ),
        Alert(
            "VlmserveKVCacheNearFull",
            q.gauge_by(q.vllm_sel(q.VLLM_KV_USAGE), per_replica, "max"),
            ">",
            settings.kv_cache_full,
            "10m",
            "warning",
            "KV cache nearly full on {{ $labels.instance }}",
            "KV-cache usage {{ $value | humanizePercentage }}; expect preemptions and rising latency.",
        ),
        Alert(
            "VlmservePreemptions",
            q.rate_by(q.vllm_sel(q.VLLM_PREEMPTIONS), per_replica),
            ">",
            settings.preemptions_per_s,
            "10m",
            "warning",
            "Engine preempting requests on {{ $labels.instance }}",
            "{{ $value }} preemptions/s: KV cache too small for the load; raise gpu_memory_utilization or lower max_num_seqs.",
        ),
    ]


def _down_alerts() -> list[Alert]:
    """An engine replica or the gateway that Prometheus cannot scrape."""
    return [
        Alert(
            "VlmserveReplicaDown",
            q.Query(q.sel("up", f'job="{q.ENGINE_JOB}"'), ""),
            "<",
            1,
            "1m",
            "critical",
            "Engine replica {{ $labels.instance }} is down",
            "Prometheus cannot scrape the replica; the gateway routes around it meanwhile.",
        ),
        Alert(
            "VlmserveGatewayDown",
            q.Query(q.sel("up", f'job="{q.GATEWAY_JOB}"'), ""),
            "<",
            1,
            "1m",
            "critical",
            "The vlmserve gateway {{ $labels.instance }} is down",
            "Prometheus cannot scrape the gateway; clients get connection errors.",
        ),
    ]


def _gateway_traffic_alerts(settings: AlertSettings) -> list[Alert]:
    """Requests the gateway fails or sheds."""
    return [
        Alert(
            "VlmserveHighErrorRate",
            q.GATEWAY_ERROR_RATIO,
            ">",
            settings.error_ratio,
            "5m",
            "critical",
            f"More than {settings.error_ratio:.0%} of gateway requests fail",
            "{{ $value | humanizePercentage }} of requests failed: answered 5xx, or the stream broke after it began.",
        ),
        Alert(
            "VlmserveGatewayShedding",
            q.GATEWAY_SHED_RATE,
            ">",
            0,
            "5m",
            "warning",
            "The gateway is shedding requests",
            "{{ $value }} requests/s refused by admission control: the deployment is at capacity.",
        ),
    ]


def alert_rules(settings: AlertSettings) -> dict:
    """The Prometheus rule file (a dict to dump as YAML; also the PrometheusRule spec)."""
    rules = []
    for alert in build_alerts(settings):
        rules.append(
            {
                "alert": alert.name,
                "expr": alert.expr(settings.window),
                "for": settings.for_override or alert.for_,
                "labels": {"severity": alert.severity, **settings.extra_labels},
                "annotations": {"summary": alert.summary, "description": alert.description},
            }
        )
    return {"groups": [{"name": "vlmserve", "rules": rules}]}
