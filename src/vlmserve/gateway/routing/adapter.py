"""Adapter-aware routing: a LoRA adapter's requests go where the adapter already is, within the load bound.

vLLM runs at most `max_loras` distinct adapters in one batch: a request for another adapter waits
until a slot frees, and an adapter missing from the engine's adapter cache is loaded first (its
first-use penalty). Least outstanding tokens ignores both and scatters every adapter over every
replica, so each replica needs every adapter's slot. `AdapterResidency` keeps, per replica, the
adapters with requests in flight (what the gateway sent, exact and immediate), those the engine's
last scrape lists running or waiting (`vllm:lora_requests_info`, which also sees other gateways'
requests), and an LRU of adapters sent recently (a stand-in for the adapter cache: no engine
metric says what is loaded). `AdapterHeld` scores a replica for an adapter request:

- 1.0   the adapter has requests there now: the request joins a slot already in the batch;
- 0.75  a slot is free and the adapter was there recently (probably still loaded); 0.5 free, not recent;
- 0.25  every slot is taken but it was there recently; 0 otherwise;
- 0     on a replica over the load bound (bounds.py): a hot adapter's holder that saturates stops
        attracting it, the least loaded replica takes the next request and becomes a holder too.

Base-model requests score 0 everywhere, so least outstanding tokens alone decides them. A rare
adapter is never refused or held back: it scores highest where a slot is free, rather than queueing
behind the hot adapters that fill another replica's slots (vLLM skips a waiting request whose adapter
finds no slot, so it can wait as long as the hot ones keep theirs busy).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.bounds import load_bound
from vlmserve.gateway.routing.load import LeastOutstandingTokens, OutstandingTokens
from vlmserve.gateway.routing.pipeline import Pipeline, Scorer, fewer_in_flight_first
from vlmserve.gateway.routing.policy import Lifecycle, Outcome
from vlmserve.routing import ADAPTER_AFFINITY


class AdapterResidency(Lifecycle):
    """Which adapters each replica holds: in flight from here, in the engine's last scrape, sent recently."""

    uses_engine_load = True

    def __init__(self, recent_per_replica: int = 8, default_max_loras: int = 1, stale_after_s: float = 3.0) -> None:
        self.recent_per_replica = recent_per_replica
        self.default_max_loras = default_max_loras  # vLLM's default, until a scrape says
        self.stale_after_s = stale_after_s
        self.active: dict[int, dict[str, int]] = {}  # replica index -> adapter -> requests in flight from here
        self.recent: dict[int, OrderedDict[str, None]] = {}
        self.loads: dict[int, EngineLoad] = {}

    def _engine(self, replica: Replica) -> EngineLoad | None:
        load = self.loads.get(replica.index)
        return load if load is not None and time.monotonic() - load.scraped_at <= self.stale_after_s else None

    def running(self, replica: Replica, adapter: str) -> bool:
        """The adapter has requests on the replica now (so it holds one of its batch slots)."""
        if adapter in self.active.get(replica.index, ()):
            return True
        load = self._engine(replica)
        return load is not None and adapter in load.adapters

    def recently(self, replica: Replica, adapter: str) -> bool:
        return adapter in self.recent.get(replica.index, ())

    def free_slot(self, replica: Replica) -> bool:
        """Fewer distinct adapters have requests there than one batch may hold."""
        load = self._engine(replica)
        busy = set(self.active.get(replica.index, ()))
        if load is not None:
            busy |= load.adapters
        slots = load.max_loras if load is not None and load.max_loras else self.default_max_loras
        return len(busy) < slots

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        if request.adapter is None:
            return
        active = self.active.setdefault(replica.index, {})
        active[request.adapter] = active.get(request.adapter, 0) + 1
        self._touch(replica.index, request.adapter)

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        active = self.active.get(replica.index)
        if request.adapter is None or active is None or request.adapter not in active:
            return
        active[request.adapter] -= 1
        if not active[request.adapter]:
            del active[request.adapter]

    def on_load_update(self, replica: Replica, load: EngineLoad) -> None:
        self.loads[replica.index] = load
        for adapter in load.adapters:
            self._touch(replica.index, adapter)

    def _touch(self, index: int, adapter: str) -> None:
        recent = self.recent.setdefault(index, OrderedDict())
        recent[adapter] = None
        recent.move_to_end(adapter)
        while len(recent) > self.recent_per_replica:
            recent.popitem(last=False)

    def forget(self, replica: Replica) -> None:
        for table in (self.active, self.recent, self.loads):
            table.pop(replica.index, None)


class AdapterHeld(Scorer):
    """The module docstring's score: where the request's adapter is, under the load bound."""

    def __init__(self, residency: AdapterResidency, load_factor: float = 1.25) -> None:
        self.residency = residency
        self.load_factor = load_factor
        self._bound = 0  # this choice's load bound (prepare)

    def prepare(self, request: RoutedRequest, candidates: Sequence[Replica]) -> None:
        self._bound = load_bound(candidates, self.load_factor) if request.adapter is not None else 0

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        adapter = request.adapter
        if adapter is None or replica.in_flight + 1 > self._bound:
            return 0.0
        residency = self.residency
        if residency.running(replica, adapter):
            return 1.0
        recent = residency.recently(replica, adapter)
        if residency.free_slot(replica):
            return 0.75 if recent else 0.5
        return 0.25 if recent else 0.0


class AdapterAffinity(LeastOutstandingTokens):
    """Least outstanding tokens plus AdapterHeld; base-model requests are routed exactly as least-outstanding-tokens."""

    name = ADAPTER_AFFINITY

    def __init__(self, load_factor: float = 1.25, weight: float = 1.0, recent_per_replica: int = 8) -> None:
        self.tokens = OutstandingTokens()
        self.residency = AdapterResidency(recent_per_replica)
        Pipeline.__init__(
            self,
            [(1.0, self.tokens), (weight, AdapterHeld(self.residency, load_factor))],
            picker=fewer_in_flight_first,
            parts=(self.residency,),
        )
