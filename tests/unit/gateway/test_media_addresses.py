"""Media host addresses: which addresses count as internal, and how resolutions are bounded and cached.

Resolutions here are real (`localhost` from /etc/hosts, a .invalid name that never resolves) or go
through the policy's `lookup` seam: a blocking function run in the executor, as socket.getaddrinfo is.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from typing import Any

import pytest

from vlmserve.media.addresses import CheckedResolver, MediaAddressPolicy, internal_reason
from vlmserve.media.urls import MediaRefused, allowed_host_set, check_media


@pytest.mark.parametrize(
    "address, reason",
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("fd12::1", "private"),
        ("172.16.0.1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("64:ff9b::a9fe:a9fe", "metadata"),
        ("100.100.100.200", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.0.1", "globally routable"),
    ],
)
def test_internal_addresses_are_named(address: str, reason: str) -> None:
    found = internal_reason(ipaddress.ip_address(address))
    assert found is not None and reason in found


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700::1111", "64:ff9b::808:808"])
def test_public_addresses_pass(address: str) -> None:
    assert internal_reason(ipaddress.ip_address(address)) is None  # NAT64 of a public address included


def test_check_media_reports_each_remote_host_once() -> None:
    allowed = allowed_host_set(["a.example", "b.example"])
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "http://a.example/1.png"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "video_url", "video_url": {"url": "https://b.example/v.mp4"}},
                    {"type": "image_url", "image_url": {"url": "https://A.example/2.png"}},
                ],
            }
        ]
    }
    assert check_media(body, allowed) == [("image", "a.example"), ("video", "b.example")]


@pytest.mark.hostile("allowlisted host name that resolves to 127.0.0.1 (unit: the policy)")
async def test_a_name_resolving_to_loopback_is_refused_unless_allowed() -> None:
    with pytest.raises(MediaRefused) as refused:
        await MediaAddressPolicy().addresses("localhost", "image")
    assert "'localhost' resolves to" in refused.value.message and "loopback" in refused.value.message
    assert "--allow-internal-media-addresses" in refused.value.message
    allowed = await MediaAddressPolicy(allow_internal=True).addresses("localhost")
    assert ipaddress.ip_address("127.0.0.1") in allowed or ipaddress.ip_address("::1") in allowed


async def test_literal_and_odd_ip_spellings_are_checked() -> None:
    policy = MediaAddressPolicy()
    for host, words in (
        ("10.0.0.7", "is a private address"),
        ("169.254.169.254", "metadata"),
        ("2130706433", "resolves to 127.0.0.1"),
        ("127.1", "resolves to 127.0.0.1"),
    ):
        with pytest.raises(MediaRefused) as refused:
            await policy.addresses(host, "image")
        assert words in refused.value.message, host


async def test_a_name_that_does_not_resolve_is_refused_naming_it() -> None:
    with pytest.raises(MediaRefused) as refused:
        await MediaAddressPolicy().addresses("nothing-here.invalid", "video")
    assert refused.value.message.startswith("video URL host 'nothing-here.invalid' does not resolve")


def _answer(address: str) -> list[tuple[Any, ...]]:
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0))]


async def test_one_slow_lookup_per_host_bounded_by_the_timeout_then_cached() -> None:
    release = threading.Event()
    calls: list[str] = []

    def slow(host: str) -> list[tuple[Any, ...]]:
        calls.append(host)
        release.wait(10)
        return _answer("93.184.216.34")

    policy = MediaAddressPolicy(timeout_s=0.2, lookup=slow)
    results = await asyncio.gather(*(policy.addresses("slow.example", "image") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, MediaRefused) and "did not resolve within 0.2 s" in r.message for r in results), results
    assert calls == ["slow.example"]  # five waiters, one executor thread
    release.set()
    while "slow.example" in policy._pending:
        await asyncio.sleep(0.01)
    assert await policy.addresses("slow.example") == (ipaddress.ip_address("93.184.216.34"),)
    assert calls == ["slow.example"]  # answered from the cache


async def test_the_cache_is_bounded_and_expires() -> None:
    calls: list[str] = []

    def lookup(host: str) -> list[tuple[Any, ...]]:
        calls.append(host)
        return _answer("93.184.216.34")

    policy = MediaAddressPolicy(max_hosts=3, lookup=lookup)
    for index in range(10):
        await policy.addresses(f"h{index}.example")
    assert len(policy._cache) == 3 and list(policy._cache) == ["h7.example", "h8.example", "h9.example"]
    expiring = MediaAddressPolicy(ttl_s=0.0, lookup=lookup)
    await expiring.addresses("e.example")
    await expiring.addresses("e.example")
    assert calls.count("e.example") == 2


@pytest.mark.hostile("DNS rebinding: a media host public at the check, loopback at the gateway's fetch")
async def test_the_fetch_resolver_rechecks_what_it_connects_to() -> None:
    answers = iter(["93.184.216.34", "127.0.0.1"])
    policy = MediaAddressPolicy(ttl_s=0.0, lookup=lambda host: _answer(next(answers)))
    await policy.check_hosts([("image", "rebind.example")])  # public at the check
    with pytest.raises(OSError, match="loopback"):  # what aiohttp would connect to is checked again
        await CheckedResolver(policy).resolve("rebind.example", 80, socket.AF_UNSPEC)


async def test_a_requests_hosts_resolve_at_once() -> None:
    both_started = threading.Barrier(2, timeout=2)

    def lookup(host: str) -> list[tuple[Any, ...]]:  # public only when the other host's lookup runs beside it
        try:
            both_started.wait()
        except threading.BrokenBarrierError:
            return _answer("127.0.0.1")
        return _answer("93.184.216.34")

    await MediaAddressPolicy(timeout_s=5, lookup=lookup).check_hosts([("image", "a.example"), ("video", "b.example")])
