"""Where an allowlisted media host really is: refuse hosts that resolve to internal addresses (SSRF).

The allowlist (media.py) names hosts, but a name is only as safe as the addresses it resolves to:
an allowlisted `images.example.com` whose DNS answers 127.0.0.1, 10.0.0.5 or 169.254.169.254
would have the gateway (images) or an engine (video, audio, files) fetch an internal resource.
So every remote media host in a request is resolved here, and the request is refused with 400
when any of its addresses is loopback, private, link-local, multicast, reserved, unspecified,
not globally routable, or a cloud metadata address, unless the operator opted in with
`--allow-internal-media-addresses` (an image server on the internal network, on purpose).

- Resolution never runs on the event loop: `socket.getaddrinfo` runs in the loop's default
  executor (what `loop.getaddrinfo` does), bounded by RESOLVE_TIMEOUT_S. Lookups of one host
  share one executor thread, so a slow resolver cannot take the whole pool (the thread itself
  finishes when the system resolver gives up; a timed-out wait does not stop it).
- Answers (addresses, or the failure) are kept CACHE_TTL_S in a cache of at most
  CACHE_MAX_HOSTS hosts; allowlisted hosts are few, so this bounds both the lookups and memory.
- The gateway's own fetches (image_preflight.RemoteFetcher) connect through `CheckedResolver`,
  which hands aiohttp the same checked addresses: what was checked is what is connected to, so
  DNS rebinding between the check and the gateway's fetch cannot slip an internal address in.
  An engine fetching a video or audio URL resolves the name again itself; docs/security.md
  says what narrows that window (vLLM's own allowlist, redirects off).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

from vlmserve.media.urls import MediaRefused

ALLOW_INTERNAL_FLAG = "--allow-internal-media-addresses"
RESOLVE_TIMEOUT_S = 3.0
"""How long one media host's resolution may take before the request is refused (400)."""
CACHE_TTL_S = 30.0
"""How long a resolution (or its failure) is reused; getaddrinfo does not report the record's TTL."""
CACHE_MAX_HOSTS = 256

CLOUD_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.170.2",  # AWS ECS task metadata
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS IPv6
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Lookup = Callable[[str], list[tuple[Any, ...]]]
"""A blocking resolver, run in the executor: socket.getaddrinfo's answer for a host name."""


def system_lookup(host: str) -> list[tuple[Any, ...]]:
    """The system resolver, as aiohttp's own resolver calls it (TCP, any family)."""
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)


def _embedded_ipv4(address: Address) -> Address:
    """The IPv4 address inside an IPv4-mapped, 6to4 or NAT64 IPv6 address (each reaches it)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def internal_reason(address: Address) -> str | None:
    """Why an engine or the gateway must not fetch from `address` (None: a public address)."""
    target = _embedded_ipv4(address)  # the address a connection to `address` ends up at
    if target in CLOUD_METADATA:
        return "a cloud metadata address"
    for reason, test in (
        ("a loopback", target.is_loopback),
        ("an unspecified", target.is_unspecified),
        ("a link-local", target.is_link_local),
        ("a multicast", target.is_multicast),
        ("a private", target.is_private),
        ("a reserved", target.is_reserved),
    ):
        if test:
            return f"{reason} address"
    if not target.is_global:
        return "not a globally routable address"
    return None


def literal_address(host: str) -> Address | None:
    """`host` as an IP address when it is one written plainly (IPv6 without brackets)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class MediaAddressPolicy:
    """Resolves media hosts off the event loop and refuses internal addresses; one per gateway."""

    def __init__(
        self,
        allow_internal: bool = False,
        *,
        timeout_s: float = RESOLVE_TIMEOUT_S,
        ttl_s: float = CACHE_TTL_S,
        max_hosts: int = CACHE_MAX_HOSTS,
        lookup: Lookup = system_lookup,
    ) -> None:
        self.allow_internal = allow_internal
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.max_hosts = max_hosts
        self.lookup = lookup  # a seam: tests put a slow resolver here, run in the executor like this one
        self._cache: OrderedDict[str, tuple[float, tuple[Address, ...] | str]] = OrderedDict()
        self._pending: dict[str, asyncio.Task[tuple[Address, ...] | str]] = {}

    async def check_hosts(self, hosts: Iterable[tuple[str, str]]) -> None:
        """MediaRefused for the first (kind, host) whose addresses may not be fetched."""
        if self.allow_internal:
            return
        listed = list(hosts)
        if len(listed) > 1:  # several hosts resolve at once: a request waits for its slowest, not their sum
            await asyncio.gather(*(self._resolve(host) for _, host in listed if literal_address(host) is None))
        for kind, host in listed:
            await self.addresses(host, kind)

    async def addresses(self, host: str, kind: str = "media") -> tuple[Address, ...]:
        """The host's addresses, all checked: MediaRefused naming the host when one is internal,
        when it does not resolve, or when the resolution takes longer than timeout_s."""
        literal = literal_address(host)
        found = (literal,) if literal is not None else await self._resolve(host)
        if isinstance(found, str):
            raise MediaRefused(f"{kind} URL host {host!r} {found}: check the URL, or send the {kind} inline as a data: URL")
        if not self.allow_internal:
            for address in found:
                reason = internal_reason(address)
                if reason is not None:
                    shown = "is" if literal is not None else f"resolves to {address}, which is"
                    raise MediaRefused(
                        f"{kind} URL host {host!r} {shown} {reason}; media is never fetched from "
                        f"internal addresses: send the {kind} inline as a data: URL (an operator "
                        f"serving media from an internal host on purpose passes {ALLOW_INTERNAL_FLAG})"
                    )
        return found

    async def _resolve(self, host: str) -> tuple[Address, ...] | str:
        """The cached or fresh answer: the addresses, or why there are none (a phrase)."""
        now = time.monotonic()
        cached = self._cache.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        task = self._pending.get(host)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._lookup(host))
            self._pending[host] = task
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(task)  # a timed-out wait leaves the shared lookup running
        except TimeoutError:
            return f"did not resolve within {self.timeout_s:g} s"

    async def _lookup(self, host: str) -> tuple[Address, ...] | str:
        try:
            infos = await asyncio.get_running_loop().run_in_executor(None, self.lookup, host)
            found: tuple[Address, ...] | str = tuple(
                dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos)
            )
            if not found:
                found = "does not resolve (no addresses)"
        except (OSError, UnicodeError, ValueError) as err:
            found = f"does not resolve ({getattr(err, 'strerror', None) or type(err).__name__})"
        finally:
            self._pending.pop(host, None)
        self._cache[host] = (time.monotonic() + self.ttl_s, found)
        self._cache.move_to_end(host)
        while len(self._cache) > self.max_hosts:
            self._cache.popitem(last=False)
        return found


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver for the gateway's media fetches: only addresses the policy checked."""

    def __init__(self, policy: MediaAddressPolicy) -> None:
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        try:
            found = await self.policy.addresses(host)
        except MediaRefused as refused:
            raise OSError(refused.message) from None  # aiohttp reports it as a connection error
        results = [
            ResolveResult(
                hostname=host,
                host=str(address),
                port=port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for address in found
            if family == socket.AF_UNSPEC or family == (socket.AF_INET6 if address.version == 6 else socket.AF_INET)
        ]
        if not results:
            raise OSError(f"{host} has no address of the requested family")
        return results

    async def close(self) -> None:
        return None
