"""Prefix affinity: send a conversation where its longest prefix was sent before, within a load bound.

Each replica gets an LRU set of the block hashes routed to it (a stand-in for what its prefix
cache holds). A request goes to the replica matching most leading blocks, unless that replica
would pass `load_factor` × the fair share of in-flight requests (bounds.py); then the next best
under the bound takes it. A prefix held nowhere is placed by rendezvous hashing of its first
block, so repeats of a new prefix land together, again within the bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.bounds import under_load_bound
from vlmserve.gateway.routing.pipeline import Pipeline, ScoreFn, Scorer, fewer_in_flight_first
from vlmserve.routing import PREFIX_AFFINITY


class PrefixCache(Scorer):
    """Share of the request's leading blocks the replica was sent before (0 with no blocks)."""

    uses_prefix_hashes = True

    def __init__(self, blocks_per_replica: int = 100_000) -> None:
        self.blocks_per_replica = blocks_per_replica
        self._blocks: dict[int, OrderedDict[int, None]] = {}

    def matched_blocks(self, request: RoutedRequest, replica: Replica) -> int:
        """Leading blocks of the request the replica holds."""
        cached = self._blocks.get(replica.index)
        if not cached:
            return 0
        matched = 0
        for block in request.prefix_hashes:
            if block not in cached:
                break
            matched += 1
        return matched

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        blocks = len(request.prefix_hashes)
        return self.matched_blocks(request, replica) / blocks if blocks else 0.0

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        cached = self._blocks.setdefault(replica.index, OrderedDict())
        for block in request.prefix_hashes:
            if block in cached:
                cached.move_to_end(block)
            else:
                cached[block] = None
        while len(cached) > self.blocks_per_replica:
            cached.popitem(last=False)

    def forget(self, replica: Replica) -> None:
        self._blocks.pop(replica.index, None)


def pick_by_prefix(request: RoutedRequest, candidates: Sequence[Replica], score: ScoreFn | None, rotation: int) -> Replica:
    """How prefix affinity breaks ties.

    No blocks to follow: the fewest requests in flight, rotating among equals. Blocks held
    somewhere: the best match, then fewer in flight, then the first in the list (a conversation
    keeps going to one of its holders rather than rotating among them). Blocks held nowhere (every
    score 0): rendezvous hashing of the first block, so the repeats of a new prefix meet."""
    if not request.prefix_hashes or score is None:
        return fewer_in_flight_first(request, candidates, score, rotation)
    best: Replica | None = None
    best_score = 0.0
    for replica in candidates:
        value = score(request, replica)
        if value > best_score or (best is not None and value == best_score and replica.in_flight < best.in_flight):
            best, best_score = replica, value
    if best is not None:
        return best
    first_block = request.prefix_hashes[0]
    return max(candidates, key=lambda replica: hash((first_block, replica.url)))


class PrefixAffinity(Pipeline):
    """Under the load bound, the prefix-cache scorer, picked by pick_by_prefix."""

    name = PREFIX_AFFINITY

    def __init__(self, load_factor: float = 1.25, blocks_per_replica: int = 100_000) -> None:
        self.load_factor = load_factor
        self.cache = PrefixCache(blocks_per_replica)
        super().__init__([(1.0, self.cache)], filters=(under_load_bound(load_factor),), picker=pick_by_prefix)
        self.affinity_hits = 0  # sent to a replica holding the longest prefix any candidate holds
        self.bound_overrides = 0  # a replica held a longer prefix but was over the bound

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        chosen = super().choose(request, candidates)
        if request.prefix_hashes:
            best_any = max(self.cache.matched_blocks(request, replica) for replica in candidates)
            if best_any:
                if self.cache.matched_blocks(request, chosen) == best_any:
                    self.affinity_hits += 1
                else:
                    self.bound_overrides += 1
        return chosen
