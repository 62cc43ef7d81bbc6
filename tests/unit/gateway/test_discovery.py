"""Replicas that come and go, without engines: the pool's set changes, policy state, the sources' parsing.

(The same against sim engines and a real bench: tests/integration/gateway/test_discovery.py.)
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from kubernetes import client

from vlmserve.discovery.k8s import urls_from_slices
from vlmserve.discovery.sources import DiscoveryError, DiscoveryWatcher, DnsSource, FileSource, parse_replica_list, url_for
from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica, ReplicaPool
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing import (
    EngineAware,
    ImageAffinity,
    ImageMemory,
    LeastOutstandingTokens,
    Outcome,
    Pipeline,
    PrefixAffinity,
    SessionAffinity,
)


def make_pool(static: list[str], max_ejection_fraction: float = 0.5) -> ReplicaPool:
    """A pool that is never started (no probe client): set changes only, no health checks."""
    return ReplicaPool(static, max_ejection_fraction=max_ejection_fraction)


def urls(replicas: list[Replica]) -> list[str]:
    return [r.url for r in replicas]


def test_new_replicas_join_unhealthy_and_static_ones_never_leave() -> None:
    pool = make_pool(["http://static:1"])
    added, removed = pool.set_discovered(["http://a:1/", "http://b:1", "http://static:1"])
    assert urls(added) == ["http://a:1", "http://b:1"] and removed == []
    assert urls(pool.replicas) == ["http://static:1", "http://a:1", "http://b:1"]
    assert not any(r.healthy for r in added)  # routed to only after a health check passes
    pool.replicas[0].healthy = True
    assert urls(pool.candidates(None)) == ["http://static:1"]
    added, removed = pool.set_discovered([])
    assert added == [] and urls(removed) == ["http://a:1", "http://b:1"]
    assert urls(pool.replicas) == ["http://static:1"]
    assert pool.draining == []  # nothing in flight: forgotten at once


def test_a_removed_replica_drains_then_is_forgotten_and_indices_are_never_reused() -> None:
    forgotten: list[Replica] = []
    pool = make_pool([])
    pool.on_forget = forgotten.append
    (a, b), _ = pool.set_discovered(["http://a:1", "http://b:1"])
    a.healthy = b.healthy = True
    a.in_flight = 2
    pool.set_discovered(["http://b:1"])
    assert a.draining and pool.draining == [a] and forgotten == []
    assert pool.candidates(None) == [b]  # no new requests to a draining replica
    a.in_flight = 0
    assert pool.forget_drained() == [a] and forgotten == [a] and pool.draining == []
    (c,), _ = pool.set_discovered(["http://a:1", "http://b:1"])
    assert c is not a and c.index not in (a.index, b.index)


def test_a_replica_returning_while_it_drains_is_taken_back_as_it_was() -> None:
    pool = make_pool([])
    (a,), _ = pool.set_discovered(["http://a:1"])
    a.healthy, a.in_flight = True, 1
    pool.set_discovered([])
    (back,), _ = pool.set_discovered(["http://a:1"])
    assert back is a and not a.draining and pool.draining == [] and pool.candidates(None) == [a]


def test_the_ejection_cap_follows_the_set_size() -> None:
    pool = make_pool(["http://s:1"])
    assert pool.max_ejections == 0  # one replica is never ejected
    pool.set_discovered(["http://a:1", "http://b:1", "http://c:1"])
    assert pool.max_ejections == 2
    pool.set_discovered(["http://a:1"])
    assert pool.max_ejections == 1


def routed(
    request_id: str, hashes: list[int] | None = None, digests: list[str] | None = None, session: str | None = None
) -> RoutedRequest:
    return RoutedRequest(
        request_id=request_id,
        model="m",
        stream=True,
        prompt_tokens=100,
        expected_output_tokens=50,
        prefix_hashes=hashes or [],
        image_digests=digests or [],
        image_tokens=100 if digests else 0,
        session_id=session,
    )


def kept_state(policy: Pipeline) -> list[dict]:
    """The dicts a pipeline's parts keep (image memories inside them included): all keyed by replica index."""
    kept: list[dict] = []
    for part in policy.parts:
        for value in vars(part).values():
            if isinstance(value, ImageMemory):
                value = value._seen
            if isinstance(value, dict):
                kept.append(value)
    return kept


@pytest.mark.parametrize(
    "inner", [LeastOutstandingTokens(), PrefixAffinity(), ImageAffinity(), EngineAware()], ids=lambda policy: policy.name
)
def test_policies_forget_a_drained_replica_and_route_past_it(inner) -> None:
    """Per-replica state (token counts, prefix and image LRUs, engine loads, session pins) is dropped
    when a replica leaves; a newcomer starts clean; a session pinned to the leaver re-pins."""
    policy = SessionAffinity(inner)
    pool = make_pool([])
    (a, b), _ = pool.set_discovered(["http://a:1", "http://b:1"])
    a.healthy = b.healthy = True
    first = routed("r1", hashes=[1, 2], digests=["img"], session="s")
    chosen = policy.choose(first, [a])
    policy.on_dispatch(first, chosen)
    policy.on_load_update(a, EngineLoad(waiting=1, running=1, kv_usage=0.5, scraped_at=0.0))
    policy.on_finish(first, chosen, Outcome.COMPLETED)
    pool.on_forget = policy.forget
    pool.set_discovered(["http://b:1"])  # a leaves, nothing in flight: forgotten now
    (c,), _ = pool.set_discovered(["http://b:1", "http://c:1"])
    kept = kept_state(inner)
    assert kept  # every one of these policies keeps something per replica
    for value in kept:
        assert a.index not in value, value
    assert "s" not in policy._sessions
    again = routed("r2", hashes=[1, 2], digests=["img"], session="s")
    assert not c.healthy and policy.choose(again, pool.candidates(None)) is b


def test_file_source_applies_a_change_only_once_it_reads_the_same_twice(tmp_path: Path) -> None:
    path = tmp_path / "replicas.txt"
    path.write_text("http://a:1\n# a comment\n\nhttp://b:1/\n")
    source = FileSource(path)
    assert asyncio.run(source.read()) == ["http://a:1", "http://b:1"]  # at start: at once
    assert asyncio.run(source.read()) is None  # unchanged: not even read
    path.write_text("http://a:1\nhttp://c:")  # a writer half-way through
    assert asyncio.run(source.read()) is None
    path.write_text("http://a:1\nhttp://c:1\n")
    assert asyncio.run(source.read()) is None  # changed again since the last poll: wait
    assert asyncio.run(source.read()) == ["http://a:1", "http://c:1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://a:1\njunk\n", "entry 2: 'junk' must start with http:// or https://"),
        ("ftp://a:1\n", "entry 1: 'ftp://a:1' must start with http:// or https://"),
        ("http://a:99999\n", "entry 1: 'http://a:99999' is not a URL"),
        ("http://a:1?x=1\n", "no port 0, query, fragment or user"),
        ('["http://a:1", 3]', "entry 2 is not a URL string"),
        ('["http://a:1", "http://b', "not a valid YAML/JSON list"),
        ('{"replicas": []}', "expected a list of replica URLs"),
    ],
)
def test_a_bad_replica_list_is_refused_whole(text: str, message: str) -> None:
    with pytest.raises(DiscoveryError) as refused:
        parse_replica_list(text, "replica file f")
    assert refused.value.reason == "malformed" and message in refused.value.message


def test_json_and_yaml_lists_and_ipv6_urls() -> None:
    assert parse_replica_list('["http://a:1", "https://b"]', "f") == ["http://a:1", "https://b"]
    assert parse_replica_list("- http://[::1]:8000\n", "f") == ["http://[::1]:8000"]
    assert parse_replica_list("", "f") == []
    assert url_for("::1", 80) == "http://[::1]:80" and url_for("10.0.0.7", 80) == "http://10.0.0.7:80"
    assert url_for("fe80::1%eth0", 80) == "http://[fe80::1]:80"


def test_a_dns_name_that_stops_resolving_keeps_the_set_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """Real resolution both times: `localhost` resolves everywhere, `.invalid` nowhere (RFC 6761)."""
    applied: list[list[str]] = []
    errors: list[str] = []
    source = DnsSource("localhost", 8000)
    watcher = DiscoveryWatcher(source, 1.0, lambda found: applied.append(list(found)), errors.append)

    async def scenario() -> None:
        assert await watcher.poll()
        source.name = "engines.invalid"  # the records went away
        assert not await watcher.poll()
        assert not await watcher.poll()

    with caplog.at_level(logging.WARNING, logger="vlmserve.gateway"):
        asyncio.run(scenario())
    assert len(applied) == 1 and "http://127.0.0.1:8000" in applied[0]
    assert watcher.applied == applied[0] and errors == ["unresolved", "unresolved"]
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("DNS name engines.invalid does not resolve (")
    assert warnings[0].endswith("); keeping the previous replica set")


def test_endpoint_slices_give_ready_endpoints_on_the_named_port() -> None:
    def endpoint(address: str, ready: bool | None) -> client.V1Endpoint:
        conditions = None if ready is None else client.V1EndpointConditions(ready=ready)
        return client.V1Endpoint(addresses=[address], conditions=conditions)

    port = client.DiscoveryV1EndpointPort
    slices = [
        client.V1EndpointSlice(
            address_type="IPv4",
            endpoints=[endpoint("10.0.0.1", True), endpoint("10.0.0.2", False), endpoint("10.0.0.3", None)],
            ports=[port(name="metrics", port=9090), port(name="http", port=8000)],
        ),
        client.V1EndpointSlice(address_type="IPv6", endpoints=[endpoint("fd00::4", True)], ports=[port(name="http", port=8000)]),
        client.V1EndpointSlice(address_type="IPv4", endpoints=[endpoint("10.0.0.5", True)], ports=[port(name="grpc", port=9000)]),
    ]
    assert urls_from_slices(slices, "http") == ["http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::4]:8000"]
    # no port name: the slice's only port, else the one named http
    assert urls_from_slices(slices, None) == [
        "http://10.0.0.1:8000",
        "http://10.0.0.3:8000",
        "http://10.0.0.5:9000",
        "http://[fd00::4]:8000",
    ]


def test_a_forgotten_replica_leaves_no_metric_series() -> None:
    from vlmserve.gateway.metrics import GatewayMetrics
    from vlmserve.http1.server import ClientStats

    metrics = GatewayMetrics(lambda: {"replicas": {}, "queued": {}, "ejected": 0, "panic": False, "clients": ClientStats()})
    for replica in ("10.0.0.1:8000", "10.0.0.2:8000"):
        metrics.count_request("200", "default", replica)
        metrics.observe_latency(replica, "/v1/chat/completions", 0.1, 0.5)
        metrics.retries.labels(replica, "connect_error").inc()
        metrics.ejections.labels(replica).inc()
    metrics.forget_replica("10.0.0.1:8000")
    text = metrics.render().decode()
    assert "10.0.0.1:8000" not in text and text.count('replica="10.0.0.2:8000"') > 4
    metrics.count_request("200", "default", "10.0.0.1:8000")  # it may come back
    assert (
        'vlmserve_gateway_requests_total{replica="10.0.0.1:8000",status="200",tenant="default"} 1.0' in metrics.render().decode()
    )


def test_a_file_malformed_from_the_start_applies_nothing_until_it_is_fixed(tmp_path: Path) -> None:
    path = tmp_path / "replicas.txt"
    path.write_text("http://a:1\nhttp//b:1\n")
    applied: list[list[str]] = []
    errors: list[str] = []
    watcher = DiscoveryWatcher(FileSource(path), 1.0, lambda found: applied.append(list(found)), errors.append)

    async def scenario() -> None:
        assert not await watcher.poll() and not await watcher.poll()
        path.write_text("http://a:1\nhttp://b:1\n")
        assert not await watcher.poll()  # changed: read again next time before it is applied
        assert await watcher.poll()

    asyncio.run(scenario())
    assert errors == ["malformed", "malformed"] and applied == [["http://a:1", "http://b:1"]]
