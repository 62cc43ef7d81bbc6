"""`vlmserve gateway --workers N`: N processes on one port, restarted when they die, drained on SIGTERM,
one /metrics that sums them; bad --workers values are one-line errors."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, sim_engines
from tests.helpers.gateway_proc import GatewayProcess, start_gateway
from tests.helpers.sim import SimHandle
from vlmserve.cli.app import main


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with sim_engines(1, tmp_path_factory.mktemp("workers"), ttft_ms=10, itl_ms=20) as handles:
        yield handles[0]


def worker_requests(base_url: str) -> dict[str, float]:
    """vlmserve_gateway_worker_requests by pid, from one scrape (whichever worker answers it)."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^vlmserve_gateway_worker_requests_total\{pid="(\d+)"\} (\S+)$', text, re.M)
    }


def requests_total(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    return sum(
        float(m.group(1)) for m in re.finditer(r'^vlmserve_gateway_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', text, re.M)
    )


def fresh_connection_requests(base_url: str, count: int) -> list[int]:
    """`count` small completions, each on a new connection (the kernel picks a worker per connection)."""
    statuses = []
    for i in range(count):
        with httpx.Client(timeout=10) as client:
            answer = client.post(
                base_url + "/v1/completions",
                json={"model": "sim-model", "prompt": f"tooth {i}", "max_tokens": 2, "ignore_eos": True},
            )
            statuses.append(answer.status_code)
    return statuses


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_workers_share_one_port_and_metrics_sum_over_them(engine: SimHandle, tmp_path: Path) -> None:
    with start_gateway([engine.base_url], tmp_path, "--workers", "3", ready_timeout_s=90) as gateway:
        assert all(status == 200 for status in fresh_connection_requests(gateway.base_url, 40))
        by_pid = worker_requests(gateway.base_url)
        assert len(by_pid) >= 2, by_pid  # 40 connections spread by the kernel over 3 workers
        assert all(int(pid) != gateway.process.pid for pid in by_pid)  # the supervisor serves nothing itself
        assert sum(by_pid.values()) == 40
        assert requests_total(gateway.base_url) == 40  # the same sum, whichever worker answers the scrape
        log = gateway.log_path.read_text()
        assert "3 workers" in log


@pytest.mark.hostile("a gateway worker is SIGKILLed: the other serves meanwhile, it is restarted, counters kept")
def test_a_killed_worker_is_restarted_and_serving_goes_on(engine: SimHandle, tmp_path: Path) -> None:
    with start_gateway([engine.base_url], tmp_path, "--workers", "2", ready_timeout_s=90) as gateway:
        fresh_connection_requests(gateway.base_url, 20)
        victim = int(next(iter(worker_requests(gateway.base_url))))
        os.kill(victim, signal.SIGKILL)
        # meanwhile the other worker serves every new connection
        assert all(status == 200 for status in fresh_connection_requests(gateway.base_url, 10))
        wait_for(lambda: "restarting it" in gateway.log_path.read_text(), "the supervisor to notice")

        def two_live_workers() -> bool:
            fresh_connection_requests(gateway.base_url, 6)
            return len([pid for pid in worker_requests(gateway.base_url) if int(pid) != victim]) >= 2

        wait_for(two_live_workers, "a new worker to serve", timeout_s=60)
        # the dead worker's counts stay in the sums (counters never go down)
        assert requests_total(gateway.base_url) == sum(worker_requests(gateway.base_url).values())


async def _streams_through_sigterm(gateway: GatewayProcess) -> list:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        under_way = [asyncio.Event() for _ in range(8)]
        streams = [
            asyncio.create_task(post_chat(session, gateway.base_url, chat_body(f"q{i}", max_tokens=40), first_token=event))
            for i, event in enumerate(under_way)
        ]
        # every stream is mid-answer (40 tokens x 20 ms: most of each is still to come)
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in under_way)), 60)
        gateway.process.send_signal(signal.SIGTERM)
        return list(await asyncio.gather(*streams))


def test_sigterm_drains_streams_in_flight_on_every_worker(engine: SimHandle, tmp_path: Path) -> None:
    with start_gateway([engine.base_url], tmp_path, "--workers", "2", ready_timeout_s=90) as gateway:
        results = asyncio.run(_streams_through_sigterm(gateway))
        assert all(r.status == 200 and r.done and r.error is None and r.completion_tokens == 40 for r in results)
        assert gateway.process.wait(timeout=30) == 0


@pytest.mark.hostile("gateway --workers 0, 65 or -3: one line, exit 2")
@pytest.mark.parametrize("value", ["0", "65", "-3"])
def test_bad_workers_values_are_one_line_errors(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--replica", "http://127.0.0.1:1", "--workers", value])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2
    assert stderr.startswith("error: --workers must be between 1 and 64")
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


@pytest.mark.hostile("gateway --workers that is not a number: usage error, exit 2, no traceback")
def test_non_number_workers_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--replica", "http://127.0.0.1:1", "--workers", "many"])
    assert exited.value.code == 2 and "Traceback" not in capsys.readouterr().err
