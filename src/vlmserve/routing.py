"""Routing policy names and what "load" means, shared by the gateway and the planner.

The gateway routes real requests (`gateway/routing/`); the planner routes simulated ones
(`sched/virtual_clock.py`). A planner prediction for "least-outstanding-tokens" is only worth
something if both count load the same way: prompt tokens plus the output tokens the request may
still produce (its `max_tokens`), charged at dispatch and released when it finishes — the KV-cache
footprint a request reaches, which is what limits how many requests an engine runs at once.
"""

from __future__ import annotations

ROUND_ROBIN = "round-robin"
LEAST_OUTSTANDING_TOKENS = "least-outstanding-tokens"
PREFIX_AFFINITY = "prefix-affinity"
ENGINE_AWARE = "engine-aware"
IMAGE_AFFINITY = "image-affinity"
ADAPTER_AFFINITY = "adapter-affinity"

GATEWAY_POLICIES: tuple[str, ...] = (
    ROUND_ROBIN,
    LEAST_OUTSTANDING_TOKENS,
    PREFIX_AFFINITY,
    ENGINE_AWARE,
    IMAGE_AFFINITY,
    ADAPTER_AFFINITY,
)
"""Every policy the gateway offers (`vlmserve gateway --policy`)."""

SIMULATED_POLICIES: tuple[str, ...] = (ROUND_ROBIN, LEAST_OUTSTANDING_TOKENS)
"""The policies the planner models (`vlmserve plan --routing`); the others need engine state it lacks."""

POLICY_ALIASES: dict[str, str] = {"least-outstanding": LEAST_OUTSTANDING_TOKENS}
"""Older spellings still accepted (the planner called its token policy this before 0.2)."""


def request_load_tokens(prompt_tokens: int, max_output_tokens: int) -> int:
    """The load one request adds to its replica until it finishes."""
    return prompt_tokens + max_output_tokens
