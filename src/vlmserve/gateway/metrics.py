"""The gateway's Prometheus metrics, all named `vlmserve_gateway_*` (never `vllm:`).

Counters and histograms are updated on the request path; gauges that describe current state
(in flight, queued, replica health) are read from the live objects at scrape time, so the
request path pays nothing for them.

With `--workers N` (workers.py) every worker process writes its counters and histograms to
PROMETHEUS_MULTIPROC_DIR and a scrape, whichever worker answers it, sums them over all workers
(prometheus_client's multiprocess mode); `vlmserve_gateway_worker_requests{pid}` shows each
worker's share. The state gauges are the answering worker's own (its in-flight requests, its
view of the replicas): per-process state stays per process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class _StateCollector(Collector):
    """Gauges computed from a snapshot function when Prometheus scrapes."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        state = self._snapshot()
        in_flight = GaugeMetricFamily(
            "vlmserve_gateway_in_flight", "Requests sent to a replica and not finished", labels=["replica"]
        )
        healthy = GaugeMetricFamily(
            "vlmserve_gateway_replica_healthy", "1 if the replica passes health checks and is not ejected", labels=["replica"]
        )
        outstanding = GaugeMetricFamily(
            "vlmserve_gateway_outstanding_tokens",
            "Tokens in flight per replica as the least-outstanding-tokens policy counts them",
            labels=["replica"],
        )
        for name, figures in state["replicas"].items():
            in_flight.add_metric([name], figures["in_flight"])
            healthy.add_metric([name], 1.0 if figures["routable"] else 0.0)
            if figures.get("outstanding_tokens") is not None:
                outstanding.add_metric([name], figures["outstanding_tokens"])
        queued = GaugeMetricFamily("vlmserve_gateway_queued", "Requests waiting for an admission slot", labels=["priority"])
        for priority, count in state["queued"].items():
            queued.add_metric([priority], count)
        replicas = GaugeMetricFamily(
            "vlmserve_gateway_replicas",
            "Replicas in the set by state: routable, not_ready (joined or failing its health check), draining (left the source, requests still in flight)",
            labels=["state"],
        )
        for state_name, count in state.get("replica_states", {}).items():
            replicas.add_metric([state_name], count)
        yield from (replicas, in_flight, healthy, outstanding, queued)
        yield GaugeMetricFamily(
            "vlmserve_gateway_ejected_replicas",
            "Replicas passively ejected now (breaker open or probing)",
            value=state["ejected"],
        )
        yield GaugeMetricFamily(
            "vlmserve_gateway_panic",
            "1 when every replica passing its health check is ejected, so all of them are routed to",
            value=1.0 if state["panic"] else 0.0,
        )
        clients = state["clients"]
        yield GaugeMetricFamily("vlmserve_gateway_client_connections", "Client connections open", value=clients.open)
        yield CounterMetricFamily(
            "vlmserve_gateway_client_connections_refused",
            "Client connections answered 503 over --max-connections",
            value=clients.refused,
        )
        yield CounterMetricFamily(
            "vlmserve_gateway_client_header_timeouts",
            "Client connections closed (408) for not sending complete headers in time",
            value=clients.header_timeouts,
        )
        yield CounterMetricFamily(
            "vlmserve_gateway_client_requests_refused",
            "Requests the HTTP server refused before any route (malformed, head or body too large, bad version)",
            value=clients.malformed,
        )
        if state.get("state_available") is not None:  # only with --state: there is nothing to be unavailable otherwise
            yield GaugeMetricFamily(
                "vlmserve_gateway_state_available",
                "1 while the shared admission state (--state redis://...) answers; 0 while rate limits fall back per --state-unavailable",
                value=1.0 if state["state_available"] else 0.0,
            )


class GatewayMetrics:
    """One registry per gateway, so several gateways can live in one process (tests)."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        counter = functools.partial(Counter, registry=self.registry)
        histogram = functools.partial(Histogram, buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.requests = counter(
            "vlmserve_gateway_requests",
            "Requests finished, by final status (HTTP code, stream_error, abandoned)",
            ["status", "tenant", "replica"],
        )
        self.ttft = histogram(
            "vlmserve_gateway_time_to_first_token_seconds",
            "Request received to first response byte sent, at the gateway; generation routes only",
            ["replica", "route"],
        )
        self.e2e = histogram(
            "vlmserve_gateway_e2e_request_latency_seconds",
            "Request received to last byte sent, at the gateway",
            ["replica", "route"],
        )
        self.retries = counter(
            "vlmserve_gateway_retries",
            "Attempts retried on another replica, by the replica that failed and why",
            ["replica", "reason"],
        )
        self.ejections = counter("vlmserve_gateway_ejections", "Replicas ejected by their circuit breaker", ["replica"])
        self.shed = counter(
            "vlmserve_gateway_shed_requests",
            "Requests refused by admission control (429; 503 when the shared state is unreachable in closed mode)",
            ["tenant", "reason"],
        )
        self.images = counter(
            "vlmserve_gateway_images",
            "Images through the preflight, by outcome (inline, fetched, downscaled) or refusal code",
            ["outcome"],
        )
        self.image_preflight = histogram(
            "vlmserve_gateway_image_preflight_seconds", "Time the image preflight took per request with images (fetch included)"
        )
        self.replica_changes = counter(
            "vlmserve_gateway_replica_changes", "Replicas that joined or left the set through --discover", ["change"]
        )
        self.discovery_errors = counter(
            "vlmserve_gateway_discovery_errors",
            "Failed reads of the --discover source "
            "(the previous set is kept), by reason: unreadable, malformed, unresolved, "
            "api_error",
            ["reason"],
        )
        self.state_errors = counter(
            "vlmserve_gateway_state_errors",
            "Failed calls to the shared admission state "
            "(--state), by kind: connection, timeout, auth, response, wrong_type (a key that "
            "was not a bucket, replaced), other",
            ["kind"],
        )
        self.state_fallbacks = counter(
            "vlmserve_gateway_state_fallbacks",
            "Requests whose rate limits the shared "
            "state could not decide, by --state-unavailable mode: open (decided on "
            "per-process limits), closed (refused with 503)",
            ["mode"],
        )
        self.worker_requests = counter(
            "vlmserve_gateway_worker_requests", "Requests finished by each gateway worker process (--workers)", ["pid"]
        )
        self._state = _StateCollector(snapshot)
        self.registry.register(self._state)
        # a worker's share means something only beside other workers (--workers); one process skips the count
        self._worker_child = self.worker_requests.labels(str(os.getpid())) if self._multiprocess_dir else None
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._latency_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def count_request(self, status: str, tenant: str, replica: str) -> None:
        key = (status, tenant, replica)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()
        if self._worker_child is not None:
            self._worker_child.inc()

    def observe_latency(self, replica: str, route: str, ttft_s: float | None, e2e_s: float) -> None:
        """The histograms of a finished request: TTFT only where the route generates tokens (None
        otherwise: a /tokenize answer's first byte is not a first token). Hot path: the labelled
        children are looked up once per (replica, route), and a route without a first token gets no
        TTFT series (a route either generates or not, so its first request decides)."""
        key = (replica, route)
        children = self._latency_children.get(key)
        if children is None:
            children = self._latency_children[key] = (
                self.ttft.labels(*key) if ttft_s is not None else None,
                self.e2e.labels(*key),
            )
        if ttft_s is not None and children[0] is not None:
            children[0].observe(ttft_s)
        children[1].observe(e2e_s)

    def forget_replica(self, replica: str) -> None:
        """Drop the per-replica series of a replica that left and drained (pods come and go: labels must not pile up)."""
        for key in [key for key in self._latency_children if key[0] == replica]:
            del self._latency_children[key]
        for request_key in [key for key in self._request_children if key[2] == replica]:
            del self._request_children[request_key]
        for metric in (self.retries, self.ejections, self.requests, self.ttft, self.e2e):
            names = metric._labelnames  # prometheus_client keeps label values per child; no public iterator
            position = names.index("replica")
            for values in [v for v in list(metric._metrics) if v[position] == replica]:
                metric.remove(*values)

    def render(self) -> bytes:
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry(auto_describe=False)  # every worker's counters and histograms, summed
        MultiProcessCollector(merged, self._multiprocess_dir)
        merged.register(self._state)
        return generate_latest(merged)
