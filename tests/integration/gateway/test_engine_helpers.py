"""vLLM's /version, /tokenize and /detokenize reach a replica through the gateway.

The bench sizes exact prompts with /tokenize and records the engine version from /version;
both must work when the bench points at the gateway rather than at an engine.
"""

from __future__ import annotations

import aiohttp

from tests.helpers.gateway_fixtures import MODEL, running_gateway
from tests.helpers.sim import SimHandle


async def test_version_and_tokenize_are_forwarded(constant_engines: list[SimHandle]) -> None:
    async with running_gateway(constant_engines[:2]) as gw, aiohttp.ClientSession() as session:
        async with session.get(gw.base_url + "/version") as through_gateway:
            assert through_gateway.status == 200
            version = (await through_gateway.json())["version"]
        async with session.get(constant_engines[0].base_url + "/version") as direct:
            assert (await direct.json())["version"] == version
        body = {"model": MODEL, "prompt": "the same words give the same tokens"}
        async with session.post(gw.base_url + "/tokenize", json=body) as through_gateway:
            assert through_gateway.status == 200
            tokenized = await through_gateway.json()
        async with session.post(constant_engines[1].base_url + "/tokenize", json=body) as direct:
            assert (await direct.json())["tokens"] == tokenized["tokens"]
        assert tokenized["count"] == len(tokenized["tokens"]) > 0
