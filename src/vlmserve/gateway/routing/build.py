"""The policy a gateway's configuration names (`--policy`), with session affinity on top."""

from __future__ import annotations

from collections.abc import Callable

from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.routing.adapter import AdapterAffinity
from vlmserve.gateway.routing.engine_load import EngineAware
from vlmserve.gateway.routing.image import ImageAffinity
from vlmserve.gateway.routing.load import LeastOutstandingTokens
from vlmserve.gateway.routing.policy import RoutingPolicy
from vlmserve.gateway.routing.prefix import PrefixAffinity
from vlmserve.gateway.routing.round_robin import RoundRobin
from vlmserve.gateway.routing.session import SessionAffinity
from vlmserve.routing import (
    ADAPTER_AFFINITY,
    ENGINE_AWARE,
    IMAGE_AFFINITY,
    LEAST_OUTSTANDING_TOKENS,
    PREFIX_AFFINITY,
    ROUND_ROBIN,
)

POLICIES: dict[str, Callable[[GatewayConfig], RoutingPolicy]] = {
    ROUND_ROBIN: lambda config: RoundRobin(),
    LEAST_OUTSTANDING_TOKENS: lambda config: LeastOutstandingTokens(),
    PREFIX_AFFINITY: lambda config: PrefixAffinity(load_factor=config.prefix_load_factor),
    ENGINE_AWARE: lambda config: EngineAware(load_factor=config.prefix_load_factor),
    IMAGE_AFFINITY: lambda config: ImageAffinity(load_factor=config.prefix_load_factor),
    ADAPTER_AFFINITY: lambda config: AdapterAffinity(load_factor=config.prefix_load_factor),
}
"""Every name in vlmserve.routing.GATEWAY_POLICIES, and how its pipeline is made from the settings."""


def build_policy(config: GatewayConfig) -> RoutingPolicy:
    """The configured policy, with session affinity layered on top."""
    make = POLICIES.get(config.policy)
    if make is None:  # GatewayConfig.validate refused it earlier; kept for direct callers
        raise ValueError(config.policy)
    return SessionAffinity(make(config))
