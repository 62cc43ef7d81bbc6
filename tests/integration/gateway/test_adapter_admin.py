"""The gateway's runtime adapter routes: admin keys only, bad bodies refused, every replica asked and reported.

(Loading a real adapter on real engines, during a bench, is tests/e2e/test_embedded_adapters.py's.)
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import running_gateway
from tests.helpers.sim import SimHandle

KEYS = """tenants:
  - name: ops
    keys: [sk-admin]
    admin: true
  - name: clinic
    keys: [sk-clinic]
"""
ADMIN, CLINIC = {"Authorization": "Bearer sk-admin"}, {"Authorization": "Bearer sk-clinic"}


async def post(session: aiohttp.ClientSession, url: str, body: object, headers: dict[str, str]) -> tuple[int, dict]:
    async with session.post(url, json=body, headers=headers) as answer:
        return answer.status, await answer.json()


@pytest.mark.hostile(
    "gateway /admin/lora/load: a non-admin key, an open gateway, a bad adapter name or path: refused, no replica asked"
)
async def test_only_an_admin_key_may_load_and_its_request_is_checked(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    good = {"lora_name": "clinic-b", "lora_path": "/models/clinic-b"}
    async with running_gateway(constant_engines[:2], keys_file=keys) as gateway, aiohttp.ClientSession() as session:
        load = f"{gateway.base_url}/admin/lora/load"
        status, body = await post(session, load, good, CLINIC)
        assert status == 403 and body["error"]["code"] == "admin_required"
        status, body = await post(session, load, good, {})
        assert status == 401
        for bad, code in (
            ({"lora_name": "../x", "lora_path": "/m"}, "invalid_lora_name"),
            ({"lora_name": "ok"}, "invalid_lora_path"),
            ({"lora_name": "ok", "lora_path": "rel/dir"}, "invalid_lora_path"),
            ("[1,2]", "invalid_lora_name"),
        ):
            status, body = await post(session, load, bad, ADMIN)
            assert (status, body["error"]["code"]) == (400, code), bad
        # sim engines have no runtime adapter loading: every replica is asked, each failure is named
        status, body = await post(session, load, good, ADMIN)
        assert status == 502 and body["error"]["code"] == "adapter_update_failed"
        message = body["error"]["message"]
        assert message.startswith("/admin/lora/load failed on 2 of 2 replica(s): ")
        assert all(f"127.0.0.1:{engine.port}: HTTP 404" in message for engine in constant_engines[:2])
        async with session.post(f"{gateway.base_url}/v1/load_lora_adapter", json=good, headers=ADMIN) as engine_path:
            assert engine_path.status == 404  # the engines' own path stays unreachable, admin or not
    async with running_gateway(constant_engines[:1]) as gateway, aiohttp.ClientSession() as session:
        status, body = await post(session, f"{gateway.base_url}/admin/lora/unload", {"lora_name": "x"}, {})
        assert status == 403 and "admin key" in body["error"]["message"]  # an open gateway has no admin
