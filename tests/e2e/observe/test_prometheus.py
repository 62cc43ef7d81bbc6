"""A real Prometheus scrapes a real gateway and sim engines; every dashboard and alert query
has data, and the TTFT alert fires on the engine that is past its SLO.

One fast engine (~2 ms TTFT) and one slow engine (constant 300 ms TTFT) sit behind the
gateway, which admits two requests at a time and queues none, so load also makes it shed.
The alert SLO is 100 ms with `for: 0s` and 10 s rate windows so the test is quick.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateway_proc import free_port, start_gateway, stop_process, wait_http_ok
from tests.helpers.sim import start_sim_engine
from vlmserve.observe import queries as q
from vlmserve.observe.alerts import AlertSettings, alert_rules, build_alerts
from vlmserve.observe.pack import to_yaml
from vlmserve.observe.scrape import prometheus_config

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None, reason="prometheus not installed (Debian package 'prometheus'; scripts/ci-system-deps installs it)"
    ),
    pytest.mark.slow,
]

MODEL = "sim-model"
WINDOW = "10s"
SETTINGS = AlertSettings(ttft_slo_s=0.1, window=WINDOW, for_override="0s")


def _host_port(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


class LoadThread(threading.Thread):
    """Keeps `concurrency` chat requests going through the gateway until stopped."""

    def __init__(self, base_url: str, concurrency: int = 6) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.concurrency = concurrency
        self.stop_event = threading.Event()
        self.statuses: list[int] = []

    async def _loop(self, client: httpx.AsyncClient, worker: int) -> None:
        index = 0
        while not self.stop_event.is_set():
            index += 1
            body = {
                "model": MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"shared clinic prefix {worker} {index}"}],
            }
            try:
                response = await client.post(f"{self.base_url}/v1/chat/completions", json=body)
                self.statuses.append(response.status_code)
            except httpx.HTTPError:
                self.statuses.append(0)
            await asyncio.sleep(0.02)

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(self._loop(client, worker) for worker in range(self.concurrency)))

    def run(self) -> None:
        asyncio.run(self._main())


@pytest.fixture
def prometheus_over_deployment(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(prometheus url, slow engine instance, fast engine instance) with load running."""
    with (
        start_sim_engine(model=MODEL, ttft_ms=2, itl_ms=1) as fast,
        start_sim_engine(model=MODEL, ttft_ms=300, itl_ms=1) as slow,
        start_gateway(
            [fast.base_url, slow.base_url],
            tmp_path,
            "--policy",
            "least-outstanding-tokens",
            "--max-in-flight",
            "2",
            "--queue-limit-interactive",
            "0",
        ) as gateway,
    ):
        rules_path = tmp_path / "alerts.yaml"
        rules_path.write_text(to_yaml(alert_rules(SETTINGS)))
        config = prometheus_config(
            [_host_port(gateway.base_url)],
            [_host_port(fast.base_url), _host_port(slow.base_url)],
            deployment="test",
            scrape_interval="1s",
            rule_files=[str(rules_path)],
        )
        config_path = tmp_path / "prometheus.yml"
        config_path.write_text(to_yaml(config))
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        load = LoadThread(gateway.base_url)
        load.start()
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http_ok(f"{url}/-/ready", prometheus, tmp_path / "prometheus.log", "prometheus")
            yield url, _host_port(slow.base_url), _host_port(fast.base_url)
        finally:
            load.stop_event.set()
            load.join(timeout=30)
            stop_process(prometheus)
            log.close()
        assert 200 in load.statuses and 429 in load.statuses, "load must be served and shed"


def _finite_samples(url: str, expr: str) -> list[dict]:
    """Series of an instant query whose value is a number (NaN means: no observations in the window)."""
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    payload = response.json()
    assert payload["status"] == "success", f"{expr}: {payload}"
    return [series for series in payload["data"]["result"] if math.isfinite(float(series["value"][1]))]


def all_queries() -> dict[str, str]:
    """Every expression the dashboards and alerts use, keyed by where it is used."""
    exprs = {
        f"{panel.key}[{index}]": query.render(WINDOW) for panel in q.all_panels() for index, query in enumerate(panel.queries)
    }
    exprs.update({f"alert {alert.name}": alert.signal.render(WINDOW) for alert in build_alerts(SETTINGS)})
    return exprs


def test_every_query_has_data_and_the_ttft_alert_fires(prometheus_over_deployment) -> None:
    url, slow_instance, fast_instance = prometheus_over_deployment
    pending = dict(all_queries())
    deadline = time.monotonic() + 45
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            if _finite_samples(url, expr):
                del pending[key]
        if pending:
            time.sleep(1)
    assert not pending, f"queries without data: {pending}"
    assert len(all_queries()) >= 30

    firing: dict[str, list[dict]] = {}
    while time.monotonic() < deadline + 15:
        alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        firing = {}
        for alert in alerts:
            if alert["state"] == "firing":
                firing.setdefault(alert["labels"]["alertname"], []).append(alert)
        if "VlmserveTTFTAboveSLO" in firing:
            break
        time.sleep(1)
    ttft = firing.get("VlmserveTTFTAboveSLO", [])
    assert {alert["labels"]["instance"] for alert in ttft} == {slow_instance}, firing
    assert float(ttft[0]["value"]) > SETTINGS.ttft_slo_s
    assert "VlmserveReplicaDown" not in firing and "VlmserveGatewayDown" not in firing
