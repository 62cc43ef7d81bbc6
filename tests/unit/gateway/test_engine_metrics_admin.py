"""`GET /admin/engine-metrics` on a real gateway (in this process) over real replica servers: the
routable replicas' pages merged and labelled, a replica whose page fails named and left out, and
with a keys file an admin key only (403 in the OpenAI error format for any other)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.gateway_fixtures import running_gateway
from tests.helpers.metrics_replicas import endless, failing, page, replicas
from vlmserve.prometheus_text import MAX_PAGE_BYTES


async def get(url: str, key: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.text()


@pytest.mark.hostile(
    "gateway /admin/engine-metrics: a replica whose /metrics is endless or fails is left out and "
    "named in a comment line; the other replicas' pages are served"
)
async def test_the_routable_replicas_pages_merged_and_a_failing_one_named() -> None:
    async with replicas(page(7), page(5), endless, failing) as urls, running_gateway(urls) as gateway:
        status, text = await asyncio.wait_for(get(f"{gateway.base_url}/admin/engine-metrics"), 20)
    assert status == 200, text
    queries = {
        sample.labels["replica"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:prefix_cache_queries_total"
    }
    assert queries == {urls[0]: 7.0, urls[1]: 5.0}
    assert f"# replica {urls[2]} left out: over {MAX_PAGE_BYTES:,} bytes" in text.splitlines()
    assert f"# replica {urls[3]} left out: error" in text.splitlines()


@pytest.mark.hostile(
    "gateway /admin/engine-metrics with a keys file: no key 401, a tenant's key without admin 403 "
    "(OpenAI error format); an admin key reads it"
)
async def test_with_a_keys_file_only_an_admin_key_reads_it(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: ops\n    keys: [sk-ops]\n    admin: true\n  - name: user\n    keys: [sk-user]\n")
    async with replicas(page(3)) as urls, running_gateway(urls, keys_file=keys) as gateway:
        url = f"{gateway.base_url}/admin/engine-metrics"
        missing, user, ops = await get(url), await get(url, "sk-user"), await get(url, "sk-ops")
    assert missing[0] == 401 and json.loads(missing[1])["error"]["code"] == "missing_api_key"
    assert user[0] == 403
    error = json.loads(user[1])["error"]
    assert error["code"] == "admin_required" and "admin key" in error["message"], error
    assert ops[0] == 200 and f'replica="{urls[0]}"' in ops[1]
