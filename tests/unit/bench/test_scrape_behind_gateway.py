"""The bench's server figures behind a gateway (bench/scrape.py): the replicas' counters add up, the
KV-cache usage is the fullest replica's (a utilisation is never summed), and a gateway that refuses
the bench's key for its engines' page is said once, as needing an admin key."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from tests.helpers.gateway_fixtures import running_gateway
from tests.helpers.metrics_replicas import page, replicas
from vlmserve import vllm_names
from vlmserve.bench.scrape import ADMIN_KEY_NEEDED, ServerScraper, parse_samples
from vlmserve.engines.sim.metrics import EngineMetrics
from vlmserve.prometheus_text import merge_pages


def engine_page(kv: float, queries: int) -> bytes:
    """A sim engine's page (written as vLLM's is) at this KV usage and prefix-cache query count."""
    engine = EngineMetrics("m")
    engine.kv_cache_usage.set(kv)
    engine.prefix_cache_queries.inc(queries)
    return generate_latest(engine.registry)


def test_over_replicas_counters_add_up_and_kv_usage_is_the_fullest() -> None:
    merged = merge_pages([("http://a", engine_page(0.6, 100)), ("http://b", engine_page(0.7, 40))], "replica")
    values = parse_samples(merged)
    assert values[vllm_names.KV_CACHE_USAGE] == 0.7  # not 1.3: two caches 60% and 70% full
    assert values[vllm_names.total(vllm_names.PREFIX_CACHE_QUERIES)] == 140


async def test_a_non_admin_key_is_said_to_need_an_admin_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: ops\n    keys: [sk-ops]\n    admin: true\n  - name: user\n    keys: [sk-user]\n")
    async with replicas(page(3)) as urls, running_gateway(urls, keys_file=keys) as gateway:
        summaries = {}
        for key in ("sk-user", "sk-ops"):
            scraper = ServerScraper(gateway.base_url, {"Authorization": f"Bearer {key}"}, interval_s=0)
            await scraper.start()
            summaries[key] = await scraper.stop()
    user, ops = summaries["sk-user"], summaries["sk-ops"]
    assert user.available and user.engines_unknown == ADMIN_KEY_NEEDED
    assert user.metrics_url == f"{gateway.base_url}/metrics" and user.counters["prefix_cache_queries"] is None
    assert ops.engines_unknown is None and ops.counters["prefix_cache_queries"] == 0  # 3 before, 3 after
    assert ops.metrics_url == f"{gateway.base_url}/metrics + {gateway.base_url}/admin/engine-metrics"
