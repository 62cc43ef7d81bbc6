"""Session affinity: keep requests with the same X-Session-ID on one replica, on top of any policy.

A pin overrides the inner policy outright (the inner policy is not consulted, so its state moves
as if the request had not been offered to it); a score could only nudge. The pin yields when its
replica is gone or holds more than `load_factor` × its fair share (bounds.py), so one chatty
session cannot overload a replica; it then re-pins where the inner policy sends it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.bounds import load_bound
from vlmserve.gateway.routing.policy import HOOKS, RoutingPolicy


class SessionAffinity(RoutingPolicy):
    """Pins sessions (at most `max_sessions`, least recently used dropped first) over `inner`."""

    def __init__(self, inner: RoutingPolicy, load_factor: float = 2.0, max_sessions: int = 100_000) -> None:
        self.inner = inner
        self.name = inner.name
        self.uses_prefix_hashes = inner.uses_prefix_hashes
        self.uses_engine_load = inner.uses_engine_load
        self.load_factor = load_factor
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, int] = OrderedDict()  # session key -> replica index
        for hook in HOOKS:  # the inner policy's own hooks, no call in between; forget (below) also unpins
            if hook != "forget":
                setattr(self, hook, getattr(inner, hook))

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        session = request.session_id
        if session is not None:
            pinned = self._sessions.get(session)
            if pinned is not None:
                bound = load_bound(candidates, self.load_factor)
                for replica in candidates:
                    if replica.index == pinned and replica.in_flight + 1 <= bound:
                        self._sessions.move_to_end(session)
                        return replica
        chosen = self.inner.choose(request, candidates)
        if session is not None:
            self._sessions[session] = chosen.index
            self._sessions.move_to_end(session)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return chosen

    def forget(self, replica: Replica) -> None:
        """Sessions pinned to the replica are unpinned (they re-pin on their next request)."""
        self.inner.forget(replica)
        for session in [s for s, index in self._sessions.items() if index == replica.index]:
            del self._sessions[session]
