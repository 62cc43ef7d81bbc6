"""`vlmserve bench` through a real gateway over two real sim engines reads the engines' own figures
(the gateway's /admin/engine-metrics): the prefix-cache, preemption and token counters are the sums
of what each engine's own /metrics says, the KV-cache usage peak is one replica's (never a sum over
them), and with a keys file a non-admin key is told it needs an admin key while an admin key reads
the figures."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateway_fixtures import MODEL, sim_engines
from tests.helpers.gateway_proc import start_gateway
from tests.helpers.sim import SimHandle
from vlmserve import vllm_names as vllm
from vlmserve.bench.scrape import ADMIN_KEY_NEEDED, COUNTERS, ServerScraper, parse_samples

# 64 KV blocks of 16 tokens hold under three of the bench's 384-token requests: both engines fill and preempt
ENGINE_OPTIONS = {"num_kv_blocks": 64, "max_model_len": 1024}
LOAD = (
    "--model",
    MODEL,
    "--no-progress",
    "--no-store",
    "--num-requests",
    "32",
    "--concurrency",
    "16",
    "--input-len",
    "256",
    "--output-len",
    "128",
    "--shared-prefix-len",
    "128",
)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimHandle]]:
    with sim_engines(2, tmp_path_factory.mktemp("sims"), **ENGINE_OPTIONS) as handles:
        yield handles


def own_figures(engines: list[SimHandle]) -> list[dict[str, float]]:
    """Each engine's own /metrics, read as the bench reads a page."""
    return [parse_samples(httpx.get(f"{engine.base_url}/metrics", timeout=10).text) for engine in engines]


def bench(cli, base_url: str, out: Path, *flags: str) -> tuple[dict, str]:
    result = cli("bench", "--base-url", base_url, *LOAD, "--json-out", out, *flags)
    assert result.code == 0, result.err
    return json.loads(out.read_text())["server"], result.out


def test_the_engines_figures_behind_a_gateway_are_their_own_pages_sums(
    cli, engines: list[SimHandle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each engine's own page, read right beside the bench's first and last scrapes (the bench's test
    # request comes before its first scrape, and is no part of its figures)
    own: dict[str, list[dict[str, float]]] = {}
    start, stop = ServerScraper.start, ServerScraper.stop

    async def start_beside(scraper: ServerScraper) -> None:
        own["before"] = await asyncio.to_thread(own_figures, engines)
        await start(scraper)

    async def stop_beside(scraper: ServerScraper) -> dict:
        summary = await stop(scraper)
        own["after"] = await asyncio.to_thread(own_figures, engines)
        return summary

    monkeypatch.setattr(ServerScraper, "start", start_beside)
    monkeypatch.setattr(ServerScraper, "stop", stop_beside)
    with start_gateway([engine.base_url for engine in engines], tmp_path) as gateway:
        server, out = bench(cli, gateway.base_url, tmp_path / "run.json")
    before, after = own["before"], own["after"]
    assert server["available"] and server["engines_unknown"] is None
    assert server["metrics_url"] == f"{gateway.base_url}/metrics + {gateway.base_url}/admin/engine-metrics"
    for key, (name, *_) in COUNTERS.items():
        each = [one_after.get(name, 0.0) - one_before.get(name, 0.0) for one_before, one_after in zip(before, after)]
        assert server["counters"][key] == sum(each), (key, each)
    per_engine = [
        one_after[vllm.total(vllm.NUM_PREEMPTIONS)] - one_before[vllm.total(vllm.NUM_PREEMPTIONS)]
        for one_before, one_after in zip(before, after)
    ]
    assert all(count > 0 for count in per_engine), per_engine  # both caches were full during the run ...
    assert 0.5 < server["peak_kv_cache_usage"] <= 1.0  # ... and the peak is one cache's fill, not two added
    queries, hits = server["counters"]["prefix_cache_queries"], server["counters"]["prefix_cache_hits"]
    assert queries > 0 and hits > 0 and server["prefix_cache_hit_rate"] == hits / queries
    assert "prefix-cache hit rate unknown" not in out and "peak KV usage unknown" not in out


def test_with_a_keys_file_a_non_admin_key_is_told_and_an_admin_key_reads(cli, engines: list[SimHandle], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: ops\n    keys: [sk-ops]\n    admin: true\n  - name: user\n    keys: [sk-user]\n")
    with start_gateway([engine.base_url for engine in engines], tmp_path, "--keys-file", str(keys)) as gateway:
        user, user_out = bench(cli, gateway.base_url, tmp_path / "user.json", "--api-key", "sk-user")
        ops, _ = bench(cli, gateway.base_url, tmp_path / "ops.json", "--api-key", "sk-ops")
    assert user["available"] and user["engines_unknown"] == ADMIN_KEY_NEEDED
    assert user["prefix_cache_hit_rate"] is None and user["peak_kv_cache_usage"] is None
    assert user_out.count(ADMIN_KEY_NEEDED) == 1, user_out
    assert ops["engines_unknown"] is None and ops["prefix_cache_hit_rate"] is not None
    assert ops["peak_kv_cache_usage"] is not None and ops["counters"]["preemptions"] is not None
