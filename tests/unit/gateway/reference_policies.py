"""FROZEN REFERENCE, NOT PRODUCT CODE: the routing policies as they were before the pipeline.

A verbatim copy of src/vlmserve/gateway/policies.py at commit 4413c4c (deleted when routing became
the pipeline in src/vlmserve/gateway/routing/), kept only as the oracle of
test_routing_differential.py: every `--policy` name must choose exactly what this code chose.
Do not edit it to follow the product; if a policy's behaviour is meant to change, change the
differential test's expectations instead and say why.

The original module docstring follows.

Routing policies behind one small interface.

A policy chooses a replica among the healthy candidates and hears about each request's life:
dispatched, first token, finished (completed, failed or abandoned), plus engine load updates.
The replicas' in-flight request counts are kept by the proxy (every policy may read them);
anything else a policy needs, it keeps itself from these events.

Ideas borrowed (not code): SGLang's model gateway (one policy trait, small implementations),
llm-d's endpoint picker (normalised scorers combined by weight), and consistent hashing with
bounded loads (Mirrokni et al.) for prefix affinity that cannot create a hot spot.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from enum import Enum

from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest


class Outcome(str, Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"  # the client went away; the upstream request was cancelled


class RoutingPolicy:
    """Base class: every hook is optional; `choose` is not."""

    name = "base"
    uses_prefix_hashes = False  # the proxy hashes the conversation only when a policy reads it
    uses_engine_load = False  # the pool polls engine /metrics only when a policy reads it

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        raise NotImplementedError

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


def _fewest_in_flight(candidates: Sequence[Replica], rotation: int) -> Replica:
    """Tie-break that spreads equal choices instead of always taking the first replica."""
    n = len(candidates)
    best = candidates[rotation % n]
    for offset in range(1, n):
        replica = candidates[(rotation + offset) % n]
        if replica.in_flight < best.in_flight:
            best = replica
    return best


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self) -> None:
        self._counter = 0

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        self._counter += 1
        return candidates[self._counter % len(candidates)]


class LeastOutstandingTokens(RoutingPolicy):
    """Route to the replica with the fewest tokens of work the gateway has sent and not seen done.

    A request adds prompt + expected output tokens (max_tokens) at dispatch — the KV-cache
    footprint it will reach, which is what limits how many requests an engine runs at once.
    At the first token the prompt estimate is replaced by the engine's own count when the
    stream reports it (vLLM does with `continuous_usage_stats`); the request's tokens leave
    the count when it completes, fails or is abandoned. This counts load the way an engine
    feels it, unlike request counts, which treat a 10-token and a 4,000-token request alike.
    """

    name = "least-outstanding-tokens"

    def __init__(self) -> None:
        self.outstanding: dict[int, int] = {}
        self._charged: dict[tuple[str, int], int] = {}
        self._rotation = 0

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        self._rotation += 1
        n = len(candidates)
        best = candidates[self._rotation % n]
        best_key = (self.outstanding.get(best.index, 0), best.in_flight)
        for offset in range(1, n):
            replica = candidates[(self._rotation + offset) % n]
            key = (self.outstanding.get(replica.index, 0), replica.in_flight)
            if key < best_key:
                best, best_key = replica, key
        return best

    def _charge(self, request: RoutedRequest, replica: Replica, tokens: int) -> None:
        self._charged[(request.request_id, replica.index)] = tokens
        self.outstanding[replica.index] = self.outstanding.get(replica.index, 0) + tokens

    def _refund(self, request: RoutedRequest, replica: Replica) -> None:
        tokens = self._charged.pop((request.request_id, replica.index), 0)
        self.outstanding[replica.index] = self.outstanding.get(replica.index, 0) - tokens

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self._charge(request, replica, request.expected_total_tokens)

    def on_first_token(self, request: RoutedRequest, replica: Replica) -> None:
        if request.engine_prompt_tokens is not None:
            self._refund(request, replica)
            self._charge(request, replica, request.engine_prompt_tokens + request.expected_output_tokens)

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        self._refund(request, replica)

    def forget(self, replica: Replica) -> None:
        self.outstanding.pop(replica.index, None)


def load_bound(candidates: Sequence[Replica], factor: float) -> int:
    """Most in-flight requests one replica may hold after this dispatch: factor × fair share."""
    total = sum(r.in_flight for r in candidates) + 1
    return max(1, math.ceil(factor * total / len(candidates)))


class PrefixAffinity(RoutingPolicy):
    """Send a conversation where its longest prefix was sent before, within a load bound.

    Each replica gets an LRU set of the block hashes routed to it (a stand-in for what its
    prefix cache holds). A request goes to the replica matching most leading blocks, unless
    that replica would exceed `load_factor` × the fair share of in-flight requests; then the
    next best under the bound takes it. A prefix seen nowhere is placed by rendezvous hashing
    of its first block (so repeats of a new prefix land together), again within the bound.
    """

    name = "prefix-affinity"
    uses_prefix_hashes = True

    def __init__(self, load_factor: float = 1.25, blocks_per_replica: int = 100_000) -> None:
        self.load_factor = load_factor
        self.blocks_per_replica = blocks_per_replica
        self._blocks: dict[int, OrderedDict[int, None]] = {}
        self._rotation = 0
        self.affinity_hits = 0  # chosen because of a cached prefix
        self.bound_overrides = 0  # best prefix holder was over its bound

    def matched_blocks(self, request: RoutedRequest, replica: Replica) -> int:
        cached = self._blocks.get(replica.index)
        if not cached:
            return 0
        matched = 0
        for block in request.prefix_hashes:
            if block not in cached:
                break
            matched += 1
        return matched

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        self._rotation += 1
        bound = load_bound(candidates, self.load_factor)
        allowed = [r for r in candidates if r.in_flight + 1 <= bound]
        if not request.prefix_hashes:
            return _fewest_in_flight(allowed, self._rotation)
        best_any = max(self.matched_blocks(request, r) for r in candidates)
        best: Replica | None = None
        best_key = (0, 0)
        for replica in allowed:
            key = (self.matched_blocks(request, replica), -replica.in_flight)
            if key[0] > 0 and (best is None or key > best_key):
                best, best_key = replica, key
        if best is not None and best_key[0] == best_any:
            self.affinity_hits += 1
            return best
        if best_any > 0:
            self.bound_overrides += 1
            if best is not None:
                return best
        first_block = request.prefix_hashes[0]
        return max(allowed, key=lambda r: hash((first_block, r.url)))

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


class ImageMemory:
    """Which image digests each replica was recently sent: a stand-in for its multimodal cache.

    vLLM keeps processed images (and their encoder outputs) per replica, keyed by content hash; a
    repeat on the same replica skips preprocessing and the vision encoder. An LRU of
    `images_per_replica` digests approximates what is still cached there.
    """

    def __init__(self, images_per_replica: int = 4096) -> None:
        self.images_per_replica = images_per_replica
        self._seen: dict[int, OrderedDict[str, None]] = {}

    def matched(self, request: RoutedRequest, replica: Replica) -> int:
        """How many of the request's images the replica holds."""
        seen = self._seen.get(replica.index)
        return sum(digest in seen for digest in request.image_digests) if seen else 0

    def remember(self, request: RoutedRequest, replica: Replica) -> None:
        seen = self._seen.setdefault(replica.index, OrderedDict())
        for digest in request.image_digests:
            seen[digest] = None
            seen.move_to_end(digest)
        while len(seen) > self.images_per_replica:
            seen.popitem(last=False)

    def forget(self, replica: Replica) -> None:
        self._seen.pop(replica.index, None)


class ImageAffinity(LeastOutstandingTokens):
    """Least outstanding tokens, where an image is work only on a replica that does not hold it.

    Until its first token, a request with a new image costs its replica more than its tokens: the
    frontend decodes and processes the image and the vision tower encodes it. A repeat on the
    replica that processed the image skips both (vLLM's multimodal cache is per replica). So a
    request is charged its tokens plus `hit_weight` × the tokens of each image the replica does not
    hold (the charge drops to tokens alone at the first token, as in least outstanding tokens,
    because the image work is then done), and goes where the total after dispatch is least. An
    image's repeats follow it while the replicas are near balance and go elsewhere when its holder
    is busier than the image work is worth. No replica may pass `load_factor` × the fair share of
    in-flight requests (the bound prefix affinity uses): a popular image never makes a hot spot.
    """

    name = "image-affinity"

    def __init__(self, load_factor: float = 1.25, images_per_replica: int = 4096, hit_weight: float = 2.0) -> None:
        super().__init__()
        self.load_factor = load_factor
        self.hit_weight = hit_weight
        self.memory = ImageMemory(images_per_replica)
        self.affinity_hits = 0  # sent where (some of) its images are held
        self.affinity_declined = 0  # a holder existed but was too busy (or over the bound)

    def image_work(self, request: RoutedRequest, replica: Replica) -> int:
        """Extra load of the request's images on `replica`: none for the images it holds."""
        if not request.image_digests:
            return 0
        fresh = len(request.image_digests) - self.memory.matched(request, replica)
        return round(self.hit_weight * request.image_tokens * fresh / len(request.image_digests))

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        if not request.image_digests:
            return super().choose(request, candidates)
        self._rotation += 1
        bound = load_bound(candidates, self.load_factor)
        under = [replica for replica in candidates if replica.in_flight + 1 <= bound] or list(candidates)
        n = len(under)
        best, best_key = under[0], (math.inf, 0)
        for offset in range(n):
            replica = under[(self._rotation + offset) % n]
            key = (self.outstanding.get(replica.index, 0) + self.image_work(request, replica), replica.in_flight)
            if key < best_key:
                best, best_key = replica, key
        if self.memory.matched(request, best):
            self.affinity_hits += 1
        elif any(self.memory.matched(request, replica) for replica in candidates):
            self.affinity_declined += 1
        return best

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self._charge(request, replica, request.expected_total_tokens + self.image_work(request, replica))
        self.memory.remember(request, replica)

    def forget(self, replica: Replica) -> None:
        super().forget(replica)
        self.memory.forget(replica)


class EngineAware(RoutingPolicy):
    """Score replicas from their engines' own load figures and the gateway's in-flight counts.

    Scorers (each in 0..1, higher is better), summed with weights, as llm-d's picker does:
    queue (engine waiting+running), waiting alone (a queue means the batch is full), and free
    KV cache. Requests the gateway has in flight beyond what the last scrape counted are added
    to both queue and waiting: the scrape has not seen them yet, so they herd otherwise. Scrapes older than `stale_after_s` are ignored.
    A fourth scorer, images held (the share of the request's images a replica was recently sent,
    ImageMemory), counts only for replicas under the load bound, so it steers repeats without
    overloading the replica that holds a popular image.
    """

    name = "engine-aware"
    uses_engine_load = True

    def __init__(
        self,
        queue_weight: float = 1.0,
        waiting_weight: float = 1.0,
        kv_weight: float = 1.0,
        stale_after_s: float = 3.0,
        image_weight: float = 1.0,
        load_factor: float = 1.25,
    ) -> None:
        self.image_weight = image_weight
        self.load_factor = load_factor
        self.memory = ImageMemory()
        self.queue_weight = queue_weight
        self.waiting_weight = waiting_weight
        self.kv_weight = kv_weight
        self.stale_after_s = stale_after_s
        self.loads: dict[int, EngineLoad] = {}
        self._rotation = 0

    def on_load_update(self, replica: Replica, load: EngineLoad) -> None:
        self.loads[replica.index] = load

    def _figures(self, replica: Replica, now: float) -> tuple[float, float, float]:
        load = self.loads.get(replica.index)
        if load is None or now - load.scraped_at > self.stale_after_s:
            return float(replica.in_flight), 0.0, 0.0
        engine_queue = load.waiting + load.running
        unseen = max(0.0, replica.in_flight - engine_queue)  # dispatched since the scrape: they will wait too
        return engine_queue + unseen, load.waiting + unseen, load.kv_usage

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        now = time.monotonic()
        self._rotation += 1
        figures = [self._figures(r, now) for r in candidates]
        max_queue = max(f[0] for f in figures) or 1.0
        max_waiting = max(f[1] for f in figures) or 1.0
        n = len(candidates)
        images = len(request.image_digests)
        bound = load_bound(candidates, self.load_factor) if images else 0
        best_index, best_score = 0, -math.inf
        for offset in range(n):
            i = (self._rotation + offset) % n
            queue, waiting, kv_usage = figures[i]
            score = (
                self.queue_weight * (1 - queue / max_queue)
                + self.waiting_weight * (1 - waiting / max_waiting)
                + self.kv_weight * (1 - kv_usage)
            )
            if images and candidates[i].in_flight + 1 <= bound:
                score += self.image_weight * self.memory.matched(request, candidates[i]) / images
            if score > best_score:
                best_index, best_score = i, score
        return candidates[best_index]

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self.memory.remember(request, replica)

    def forget(self, replica: Replica) -> None:
        self.loads.pop(replica.index, None)
        self.memory.forget(replica)


class SessionAffinity(RoutingPolicy):
    """Keep requests with the same X-Session-ID on one replica, on top of any policy.

    The pin yields when that replica is gone or holds more than `load_factor` × its fair share,
    so one chatty session cannot overload a replica.
    """

    def __init__(self, inner: RoutingPolicy, load_factor: float = 2.0, max_sessions: int = 100_000) -> None:
        self.inner = inner
        self.name = inner.name
        self.uses_prefix_hashes = inner.uses_prefix_hashes
        self.uses_engine_load = inner.uses_engine_load
        self.load_factor = load_factor
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, int] = OrderedDict()

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

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self.inner.on_dispatch(request, replica)

    def on_first_token(self, request: RoutedRequest, replica: Replica) -> None:
        self.inner.on_first_token(request, replica)

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        self.inner.on_finish(request, replica, outcome)

    def on_load_update(self, replica: Replica, load: EngineLoad) -> None:
        self.inner.on_load_update(replica, load)

    def forget(self, replica: Replica) -> None:
        """Sessions pinned to the replica are unpinned (they re-pin on their next request)."""
        self.inner.forget(replica)
        for session in [s for s, index in self._sessions.items() if index == replica.index]:
            del self._sessions[session]


def build_policy(config: GatewayConfig) -> RoutingPolicy:
    """The configured policy, with session affinity layered on top."""
    inner: RoutingPolicy
    if config.policy == "round-robin":
        inner = RoundRobin()
    elif config.policy == "least-outstanding-tokens":
        inner = LeastOutstandingTokens()
    elif config.policy == "prefix-affinity":
        inner = PrefixAffinity(load_factor=config.prefix_load_factor)
    elif config.policy == "engine-aware":
        inner = EngineAware(load_factor=config.prefix_load_factor)
    elif config.policy == "image-affinity":
        inner = ImageAffinity(load_factor=config.prefix_load_factor)
    else:  # validated earlier; kept for type checkers
        raise ValueError(config.policy)
    return SessionAffinity(inner)
