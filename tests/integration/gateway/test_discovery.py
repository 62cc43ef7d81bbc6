"""Replicas that come and go (`vlmserve gateway --discover`), against real sim engines and a real bench.

The issue's Done-when: a replica added to the watched file during a `vlmserve bench` run gets
traffic once its readiness check passes (and not before), and a removed one drains without a
single failed request. Then the file source's hostile inputs: junk lines, bad schemes, a
half-written list, a file that disappears — each keeps the previous set, warns and is counted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.helpers.fake_k8s_api import TOKEN, endpoint_slice, fake_k8s_api
from tests.helpers.gateway_fixtures import MODEL, varied_sim_engines
from tests.helpers.gateway_proc import start_gateway
from tests.helpers.sim import SimHandle, free_port, sim_engine_argv, wait_ready
from vlmserve.discovery.sources import url_for

DISCOVERY_FLAGS = ("--discover-interval", "0.1", "--health-interval", "0.2")


def write_replicas(path: Path, urls: list[str]) -> None:
    """Write the list elsewhere and rename it over (how a writer should update a watched file)."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text("".join(url + "\n" for url in urls))
    os.replace(scratch, path)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll until `condition` holds (a wait, not a timing assertion: the limit only ends a hung test)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def served(engine: SimHandle) -> int:
    """Generation requests the sim engine has taken (its own count, not the gateway's)."""
    return int(httpx.get(engine.base_url + "/debug/state", timeout=5).json()["requests"])


def gateway_replicas(base_url: str) -> dict[str, dict]:
    return {r["url"]: r for r in httpx.get(base_url + "/health", timeout=5).json()["replicas"]}


def metric(base_url: str, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics (0 when the series does not exist)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    pattern = re.compile(
        rf"^{re.escape(name)}(\{{{re.escape(wanted)}\}})? ([0-9.e+-]+)$" if wanted else rf"^{re.escape(name)} ([0-9.e+-]+)$", re.M
    )
    match = pattern.search(httpx.get(base_url + "/metrics", timeout=5).text)
    return float(match.groups()[-1]) if match else 0.0


def test_replica_added_during_bench_gets_traffic_after_readiness_and_removed_one_drains(tmp_path: Path) -> None:
    # Requests last about half a second (24 tokens x 20 ms), so a removed replica has some in flight.
    # The bench has no request count: it runs until every check below is done, then Ctrl-C stops it
    # (it keeps its records), so a slow machine cannot end it before the join and the drain.
    timing = {"ttft_ms": 20, "itl_ms": 20}
    with varied_sim_engines(tmp_path, [timing, timing]) as (first, second):
        replica_file = tmp_path / "replicas.txt"
        write_replicas(replica_file, [first.base_url, second.base_url])
        with start_gateway([], tmp_path, "--discover", f"file:{replica_file}", *DISCOVERY_FLAGS) as gateway:
            bench_out = tmp_path / "bench.json"
            bench_log_path = tmp_path / "bench.log"
            bench_log = bench_log_path.open("wb")
            bench = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vlmserve",
                    "bench",
                    "--base-url",
                    gateway.base_url,
                    "--model",
                    MODEL,
                    "--concurrency",
                    "6",
                    "--duration",
                    "10m",
                    "--input-len",
                    "16",
                    "--output-len",
                    "24",
                    "--server-metrics-interval",
                    "0",
                    "--json-out",
                    str(bench_out),
                    "--no-store",
                ],
                stdout=bench_log,
                stderr=subprocess.STDOUT,
            )
            late: subprocess.Popen | None = None
            try:
                wait_for(lambda: served(first) > 0 and served(second) > 0, "traffic on the first two replicas")

                # A third engine that takes 1.5 s to become ready joins the file while the bench runs.
                port = free_port()
                late_log = tmp_path / "late.log"
                with late_log.open("wb") as log:
                    late = subprocess.Popen(
                        sim_engine_argv(port, model=MODEL, startup_delay=1.5, **timing), stdout=log, stderr=subprocess.STDOUT
                    )
                third = SimHandle(late, port, late_log)
                wait_ready(third, timeout_s=60, require_health=False)  # listening, /health still 503
                write_replicas(replica_file, [first.base_url, second.base_url, third.base_url])
                wait_for(lambda: third.base_url in gateway_replicas(gateway.base_url), "the gateway to see the third replica")
                wait_for(lambda: served(third) > 0, "traffic on the third replica")
                # It only stops at our Ctrl-C: ended here, it failed (its log says why).
                assert bench.poll() is None, bench_log_path.read_text()[-2000:]
                # Before its readiness check passed it got nothing: a request sent to a starting sim
                # engine is answered 503, which the gateway would have retried and counted.
                assert (
                    metric(gateway.base_url, "vlmserve_gateway_retries_total", replica=third.base_url[7:], reason="upstream_503")
                    == 0
                )

                # The first replica leaves the file: no new requests, the ones in flight finish.
                write_replicas(replica_file, [second.base_url, third.base_url])
                wait_for(lambda: first.base_url not in gateway_replicas(gateway.base_url), "the first replica to drain")
                drained_at = served(first)
                # The load goes on after the drain, on the two replicas left (one more round of 6 users).
                left_at = served(second) + served(third)
                wait_for(lambda: served(second) + served(third) >= left_at + 6, "traffic after the first replica left")
                assert bench.poll() is None, bench_log_path.read_text()[-2000:]  # still running, as above
                # Ctrl-C: no new requests, those in flight finish, every record is written; exit 130 says
                # it was stopped (the timeout only ends a hung bench).
                bench.send_signal(signal.SIGINT)
                assert bench.wait(timeout=120) == 130, bench_log_path.read_text()[-2000:]
            finally:
                bench.kill() if bench.poll() is None else None
                bench_log.close()
                if late is not None:
                    third.stop()
            summary = json.loads(bench_out.read_text())
            counts = summary["requests"]
            assert summary["meta"]["interrupted"] is True  # stopped by our Ctrl-C, not by a count
            # every request the bench sent, before, during and after the changes, completed
            assert counts["failed"] == 0 and counts["completed"] == counts["total"] > 0, counts
            assert served(first) == drained_at  # nothing new after it drained
            assert metric(gateway.base_url, "vlmserve_gateway_replica_changes_total", change="added") == 3
            assert metric(gateway.base_url, "vlmserve_gateway_replica_changes_total", change="removed") == 1
        # it left with requests in flight (6 clients on 3 replicas, half a second each), and they finished
        left = re.search(rf"replica {re.escape(first.base_url)} left: draining (\d+) request", gateway.log_path.read_text())
        assert left is not None and int(left.group(1)) > 0
        assert f"replica {first.base_url} drained" in gateway.log_path.read_text()


def test_hostile_file_contents_keep_the_previous_set(tmp_path: Path) -> None:
    with varied_sim_engines(tmp_path, [{"ttft_ms": 5, "itl_ms": 1}]) as (engine,):
        replica_file = tmp_path / "replicas.yaml"
        write_replicas(replica_file, [engine.base_url])
        with start_gateway([], tmp_path, "--discover", f"file:{replica_file}", *DISCOVERY_FLAGS) as gateway:
            bad_contents = {
                "junk": (f"{engine.base_url}\nnot a url at all\n", "entry 2: 'not a url at all' must start with http://"),
                "bad scheme": (
                    f"{engine.base_url}\nftp://127.0.0.1:21\n",
                    "entry 2: 'ftp://127.0.0.1:21' must start with http://",
                ),
                "half-written list": (f'["{engine.base_url}", "http://127.0.0.1:1', "not a valid YAML/JSON list"),
                "not a list": ('{"replicas": ["http://127.0.0.1:1"]}', "expected a list of replica URLs"),
            }
            for what, (text, warning) in bad_contents.items():
                replica_file.write_text(text)
                wait_for(lambda warning=warning: warning in gateway.log_path.read_text(), f"the {what} file to be refused")
                assert list(gateway_replicas(gateway.base_url)) == [engine.base_url], what
                answer = httpx.post(
                    gateway.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30
                )
                assert answer.status_code == 200, what
            assert metric(gateway.base_url, "vlmserve_gateway_discovery_errors_total", reason="malformed") >= 4
            replica_file.unlink()
            wait_for(
                lambda: metric(gateway.base_url, "vlmserve_gateway_discovery_errors_total", reason="unreadable") >= 1,
                "the missing file to be counted",
            )
            replica_file.mkdir()  # a directory where the file was: unreadable too
            wait_for(
                lambda: metric(gateway.base_url, "vlmserve_gateway_discovery_errors_total", reason="unreadable") >= 3,
                "the directory to be counted",
            )
            assert list(gateway_replicas(gateway.base_url)) == [engine.base_url]
            assert httpx.get(gateway.base_url + "/health", timeout=5).status_code == 200
            replica_file.rmdir()
            replica_file.write_text(f"- {engine.base_url}\n")  # a YAML list is fine: the source recovers
        log = gateway.log_path.read_text()
        warnings = [line for line in log.splitlines() if "keeping the previous replica set" in line]
        # One warning per distinct problem, not one per poll (about 30 polls ran): four bad contents,
        # the missing file, the directory, and the missing file again if a poll fell between
        # rmdir() and the rewrite.
        assert len(bad_contents) + 1 <= len(warnings) <= len(bad_contents) + 3, "\n".join(warnings)
        assert any(
            f"replica file {replica_file}: entry 2: 'ftp://127.0.0.1:21' must start with http:// or https://" in line
            for line in warnings
        )
        assert "Traceback" not in log


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("consul:engines", "unknown source; write file:PATH, dns:NAME:PORT or k8s:NAMESPACE/SERVICE[:PORTNAME]"),
        ("file:", "no path; write file:PATH"),
        ("file:/nonexistent/replicas.txt", "/nonexistent/replicas.txt is not a file"),
        ("dns:engines", "write dns:NAME:PORT with a host name"),
        ("dns:engines:http", "port 'http' must be a number from 1 to 65535"),
        ("dns:bad_name!:8000", "write dns:NAME:PORT with a host name"),
        ("k8s:default", "write k8s:NAMESPACE/SERVICE[:PORTNAME]"),
        ("k8s:Default/engines", "write k8s:NAMESPACE/SERVICE[:PORTNAME]"),
    ],
)
def test_malformed_sources_are_one_line_errors(capsys: pytest.CaptureFixture[str], source: str, message: str) -> None:
    from vlmserve.cli.app import main

    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--discover", source])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    assert stderr.startswith("error: --discover ") and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_no_replica_and_no_source_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from vlmserve.cli.app import main

    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--discover-interval", "1"])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and "no replicas given" in stderr and "--discover SOURCE" in stderr


def test_dns_source_routes_to_every_address_the_name_resolves_to(tmp_path: Path) -> None:
    """`localhost` is a name every machine resolves without a network (127.0.0.1, and ::1 where
    the hosts file says so); a sim engine listens on each address it resolves to, on one port."""
    port = free_port()
    addresses = sorted(
        {
            info[4][0]
            for info in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
            if info[0] in (socket.AF_INET, socket.AF_INET6)
        }
    )
    engines: list[SimHandle] = []
    try:
        for address in addresses:
            argv = sim_engine_argv(port, model=MODEL, ttft_ms=5, itl_ms=1)
            argv[argv.index("--host") + 1] = address
            log_path = tmp_path / f"sim-{len(engines)}.log"
            with log_path.open("wb") as log:
                engines.append(SimHandle(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), port, log_path))
        for engine in engines:
            wait_ready(engine, timeout_s=60)
        with start_gateway([], tmp_path, "--discover", f"dns:localhost:{port}", *DISCOVERY_FLAGS) as gateway:
            expected = {url_for(address, port) for address in addresses}
            assert set(gateway_replicas(gateway.base_url)) == expected
            for _ in range(2 * len(expected)):
                answer = httpx.post(
                    gateway.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30
                )
                assert answer.status_code == 200
            assert metric(gateway.base_url, "vlmserve_gateway_replica_changes_total", change="added") == len(expected)
    finally:
        for engine in engines:
            engine.stop()


def test_dns_name_that_does_not_resolve_keeps_the_static_replicas_and_is_counted(tmp_path: Path) -> None:
    """`.invalid` never resolves (RFC 6761), with or without a network."""
    with varied_sim_engines(tmp_path, [{"ttft_ms": 5, "itl_ms": 1}]) as (engine,):
        with start_gateway([engine.base_url], tmp_path, "--discover", "dns:engines.invalid:8000", *DISCOVERY_FLAGS) as gateway:
            wait_for(
                lambda: metric(gateway.base_url, "vlmserve_gateway_discovery_errors_total", reason="unresolved") >= 2,
                "the unresolved name to be counted",
            )
            assert list(gateway_replicas(gateway.base_url)) == [engine.base_url]
            answer = httpx.post(
                gateway.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30
            )
            assert answer.status_code == 200
        warnings = [line for line in gateway.log_path.read_text().splitlines() if "does not resolve" in line]
        assert len(warnings) == 1 and "DNS name engines.invalid does not resolve" in warnings[0]


def test_k8s_source_follows_endpoint_slices_through_the_official_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `kubernetes` client, configured from a kubeconfig, lists EndpointSlices from a local
    HTTP server speaking the API's JSON (tests/helpers/fake_k8s_api.py says why it stands in for
    a real API server): ready endpoints join, an endpoint that turns unready drains, an API error
    keeps the set."""
    timing = {"ttft_ms": 5, "itl_ms": 1}
    with varied_sim_engines(tmp_path, [timing, timing]) as (first, second), fake_k8s_api() as api:
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        # Both sim engines listen on 127.0.0.1, on different ports: one slice per port name
        # would be unusual, so each gets its own slice (a Service with two EndpointSlices).
        api.slices[("vision", "engines")] = [
            endpoint_slice("engines", "vision", [("127.0.0.1", True)], first.port, name_suffix="aaaaa"),
            endpoint_slice("engines", "vision", [("127.0.0.1", True)], second.port, name_suffix="bbbbb"),
        ]
        with start_gateway([], tmp_path, "--discover", "k8s:vision/engines:http", *DISCOVERY_FLAGS) as gateway:
            assert set(gateway_replicas(gateway.base_url)) == {first.base_url, second.base_url}
            path, authorization = api.requests[0]
            assert path.startswith("/apis/discovery.k8s.io/v1/namespaces/vision/endpointslices?")
            assert parse_qs(urlsplit(path).query)["labelSelector"] == ["kubernetes.io/service-name=engines"]
            assert authorization == f"Bearer {TOKEN}"

            api.slices[("vision", "engines")][1] = endpoint_slice(
                "engines", "vision", [("127.0.0.1", False)], second.port, name_suffix="bbbbb"
            )  # pod going away
            wait_for(lambda: set(gateway_replicas(gateway.base_url)) == {first.base_url}, "the unready endpoint to drain")

            api.fail_with = 503
            wait_for(
                lambda: metric(gateway.base_url, "vlmserve_gateway_discovery_errors_total", reason="api_error") >= 2,
                "the API errors to be counted",
            )
            assert set(gateway_replicas(gateway.base_url)) == {first.base_url}
            answer = httpx.post(
                gateway.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30
            )
            assert answer.status_code == 200
        assert "listing EndpointSlices of vision/engines failed: HTTP 503" in gateway.log_path.read_text()


def test_k8s_source_without_credentials_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vlmserve.cli.app import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--discover", "k8s:vision/engines", "--port", "0"])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--discover k8s: no Kubernetes credentials" in stderr and "Traceback" not in stderr
