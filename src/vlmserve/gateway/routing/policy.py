"""What the proxy sees of routing: one policy that chooses a replica and hears each request's life.

SGLang's model gateway (smg) has one policy trait the same size: select a replica, hear that a
request finished, take a load update. Every policy here — a pipeline (pipeline.py) or the
session wrapper (session.py) — is a RoutingPolicy, so the proxy and the app never learn how a
choice is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest


class Outcome(str, Enum):
    """How one attempt on a replica ended (the proxy reports exactly one per dispatch)."""

    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"  # the client went away; the upstream request was cancelled


HOOKS = ("on_dispatch", "on_first_token", "on_finish", "on_load_update", "forget")
"""The events of Lifecycle, by name: a policy made of parts binds its parts' own hooks to them once."""


class Lifecycle:
    """The events of a request's life a policy, or a scorer in one, may keep state from (all optional)."""

    uses_prefix_hashes = False  # the proxy hashes the conversation only when a policy reads it
    uses_engine_load = False  # the pool polls engine /metrics only when a policy reads it

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        """The request is being sent to `replica` (once per attempt)."""

    def on_first_token(self, request: RoutedRequest, replica: Replica) -> None:
        """The replica produced the first bytes of the answer: the prompt is processed."""

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        """The attempt on `replica` ended (exactly once per on_dispatch)."""

    def on_load_update(self, replica: Replica, load: EngineLoad) -> None:
        """A fresh scrape of the replica's engine metrics."""

    def forget(self, replica: Replica) -> None:
        """The replica left the set and drained (nothing in flight): drop what is kept about it.

        Indices are never reused, so this only bounds memory; it never changes a routing decision."""


class RoutingPolicy(Lifecycle):
    """Chooses a replica and hears each request's life; every hook is optional, `choose` is not.

    The replicas' in-flight request counts are kept by the proxy (every policy may read them);
    anything else a policy needs, it keeps itself from these events."""

    name = "base"

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        """One of `candidates` (never empty: healthy, not ejected, serving the model) for `request`."""
        raise NotImplementedError
