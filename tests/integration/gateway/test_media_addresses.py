"""Allowlisted media hosts that resolve to internal addresses are refused at the gateway (SSRF).

Real gateways and sim engines; names resolve through the system resolver (`localhost` from
/etc/hosts, `*.invalid` never). Where a test needs a slow or changing DNS answer it replaces the
gateway's `media_addresses.lookup`: the blocking function the gateway runs in the executor in place
of socket.getaddrinfo (a slow real resolver cannot be built here without editing /etc/resolv.conf).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import post_chat, running_gateway
from tests.helpers.sim import SimHandle
from tests.integration.gateway.test_image_preflight import image_host, image_request, png_bytes
from tests.integration.gateway.test_trust_boundary import assert_media_refused, engine_state, image_chat


@pytest.mark.hostile("SSRF: allowlisted host name that resolves to 127.0.0.1 (image, video, audio)")
async def test_an_allowlisted_name_resolving_to_loopback_is_refused(constant_engines: list[SimHandle]) -> None:
    engines = constant_engines[:2]
    port = engines[0].port
    async with running_gateway(engines, allowed_media_domains=["localhost"]) as gw, aiohttp.ClientSession() as session:
        before = await engine_state(session, engines)
        for field in ("image_url", "video_url", "audio_url"):
            result = await post_chat(session, gw.base_url, image_chat(f"http://localhost:{port}/x", field))
            assert_media_refused(result, "'localhost' resolves to", "loopback address", "--allow-internal-media-addresses")
        assert await engine_state(session, engines) == before  # nothing reached an engine


@pytest.mark.hostile("SSRF: literal private, metadata and loopback IPs on the allowlist")
async def test_allowlisted_internal_ip_literals_are_refused(constant_engines: list[SimHandle]) -> None:
    listed = ["10.0.0.7", "169.254.169.254", "127.0.0.1", "::1"]
    async with running_gateway(constant_engines[:1], allowed_media_domains=listed) as gw, aiohttp.ClientSession() as session:
        for url, words in (
            ("http://10.0.0.7/x.png", "a private address"),
            ("http://169.254.169.254/latest/meta-data", "a cloud metadata address"),
            ("http://127.0.0.1:1/x.png", "a loopback address"),
            ("http://[::1]:1/v.mp4", "a loopback address"),
        ):
            assert_media_refused(await post_chat(session, gw.base_url, image_chat(url)), words, "data: URL")


@pytest.mark.hostile("SSRF opt-in: --allow-internal-media-addresses lets an internal image host through")
async def test_the_operator_may_allow_internal_media_hosts(constant_engines: list[SimHandle]) -> None:
    async with (
        image_host({"/x.png": png_bytes(16, 16)}) as host,
        running_gateway(
            constant_engines[:1], allowed_media_domains=["localhost", "127.0.0.1"], allow_internal_media_addresses=True
        ) as gw,
        aiohttp.ClientSession() as session,
    ):
        for url in (host + "/x.png", host.replace("127.0.0.1", "localhost") + "/x.png"):
            result = await post_chat(session, gw.base_url, image_request(url))
            assert result.status == 200, result.body


@pytest.mark.hostile("allowlisted media host name that does not resolve")
async def test_an_unresolvable_allowlisted_name_is_a_400_naming_it(constant_engines: list[SimHandle]) -> None:
    async with (
        running_gateway(constant_engines[:1], allowed_media_domains=["gone.invalid"]) as gw,
        aiohttp.ClientSession() as session,
    ):
        result = await post_chat(session, gw.base_url, image_chat("https://gone.invalid/x.png"))
        assert_media_refused(result, "'gone.invalid' does not resolve")


def _answer(address: str) -> list[tuple[Any, ...]]:
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0))]


@pytest.mark.hostile("media host whose DNS answer is slow: resolution off the event loop, bounded")
async def test_a_slow_resolution_neither_blocks_the_loop_nor_hangs(constant_engines: list[SimHandle]) -> None:
    release = threading.Event()

    def slow_lookup(host: str) -> list[tuple[Any, ...]]:  # blocks its executor thread, as a slow resolver does
        release.wait(30)
        return _answer("127.0.0.1")

    async with (
        running_gateway(constant_engines[:1], allowed_media_domains=["slow.example", "stuck.example"]) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
    ):
        policy = gw.gateway.media_addresses
        policy.lookup = slow_lookup
        pending = asyncio.create_task(post_chat(session, gw.base_url, image_chat("http://slow.example/x.png")))
        while "slow.example" not in policy._pending:
            await asyncio.sleep(0.01)
        async with session.get(gw.base_url + "/health") as health:  # answered while the lookup is blocked
            assert health.status == 200
        assert not pending.done()
        release.set()
        assert_media_refused(await pending, "'slow.example' resolves to 127.0.0.1", "loopback")

        release.clear()
        policy.timeout_s = 0.2
        stuck = await post_chat(session, gw.base_url, image_chat("http://stuck.example/x.png"))
        assert_media_refused(stuck, "'stuck.example' did not resolve within 0.2 s")
        release.set()


@pytest.mark.hostile("DNS rebinding: allowlisted host public at the check, loopback when the gateway fetches")
async def test_the_gateway_fetch_connects_only_to_checked_addresses(constant_engines: list[SimHandle]) -> None:
    served: list[str] = []

    async def picture(request: Any) -> Any:
        from aiohttp import web

        served.append(request.path)
        return web.Response(body=png_bytes(8, 8), content_type="image/png")

    answers = iter(["93.184.216.34"])

    def rebinding_lookup(host: str) -> list[tuple[Any, ...]]:  # public once, then the gateway's own loopback
        return _answer(next(answers, "127.0.0.1"))

    async with (
        image_host({"/x.png": picture}) as host,
        running_gateway(constant_engines[:1], allowed_media_domains=["rebind.example"]) as gw,
        aiohttp.ClientSession() as session,
    ):
        gw.gateway.media_addresses.lookup = rebinding_lookup
        gw.gateway.media_addresses.ttl_s = 0.0  # every resolution asks again: the attacker's best case
        port = host.rsplit(":", 1)[1]
        result = await post_chat(session, gw.base_url, image_request(f"http://rebind.example:{port}/x.png"))
        assert result.status == 400 and result.body["error"]["code"] == "media_fetch_failed", result.body
        assert served == []  # the loopback image host was never reached
