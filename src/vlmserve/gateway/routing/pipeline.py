"""Routing as a pipeline: filters, then weighted scorers (each 0..1), then a picker.

llm-d's endpoint picker and SGLang's router route this way. A filter drops replicas that must not
take the request (over a load bound); each scorer rates every replica left in 0..1, higher better
(little load, the request's prefix cached, its images held); the picker takes the highest weighted
sum and says how ties go. A new signal is one Scorer given a weight, not a new policy; the policies
named on the command line are fixed pipelines (build.py). The replicas a pipeline sees are already
filtered for health, ejection and model (ReplicaPool.candidates).

Scorers keep their own state from a request's life (dispatched, first token, finished, an engine
scrape, a replica forgotten) through the hooks of `Lifecycle`. `choose` runs on the event loop for every
request, so the pipeline works out once, at construction, which hooks each part really implements
and per request calls only those; a one-scorer pipeline costs one `score` call per replica more
than a hand-written loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.policy import Lifecycle, Outcome, RoutingPolicy

ScoreFn = Callable[[RoutedRequest, Replica], float]
"""A replica's score for a request: one scorer's, or the pipeline's weighted sum."""


class Part(Lifecycle):
    """A piece of a pipeline (a scorer, or state several scorers read); hears the request's life."""

    def prepare(self, request: RoutedRequest, candidates: Sequence[Replica]) -> None:
        """Once per choice, after the filters and before any score: figures shared by all the
        replicas' scores (the maxima to normalise by, a load bound), computed once, not per replica."""


class Scorer(Part):
    """One opinion about a replica for a request: 0 (worst) to 1 (best)."""

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        raise NotImplementedError


class Filter:
    """Narrows the candidates before scoring; must never return an empty list for a non-empty one."""

    def keep(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Sequence[Replica]:
        raise NotImplementedError


class Picker:
    """Takes one replica from the candidates by their weighted sum; says how ties go."""

    def pick(self, request: RoutedRequest, candidates: Sequence[Replica], score: ScoreFn | None,
             rotation: int) -> Replica:
        """`score` is the weighted sum (None: no scorers, every replica ties); `rotation` moves by one
        per choice."""
        raise NotImplementedError


def weighted_sum(scorers: Sequence[tuple[float, Scorer]]) -> ScoreFn | None:
    """The sum of weight × score, as one function built once per pipeline, added in the scorers' order.

    A lone scorer of weight 1 is its own `score`, so a one-scorer pipeline pays one call per replica
    and nothing more; None when there is no scorer."""
    if not scorers:
        return None
    if len(scorers) == 1:
        weight, scorer = scorers[0]
        if weight == 1.0:
            return scorer.score
        alone = scorer.score
        return lambda request, replica: weight * alone(request, replica)
    parts = tuple((weight, scorer.score) for weight, scorer in scorers)

    def total(request: RoutedRequest, replica: Replica) -> float:
        summed = 0.0
        for weight, score in parts:
            summed += weight * score(request, replica)
        return summed

    return total


class HighestScore(Picker):
    """The highest weighted sum, looked for from a position that moves by one each choice.

    Equal sums go to the first replica met from that position, so equal replicas share the work
    instead of the first in the list taking it all; with no scorers this is round robin. With
    `fewer_in_flight`, equal sums go first to the replica with fewer requests in flight."""

    def __init__(self, fewer_in_flight: bool = False) -> None:
        self.fewer_in_flight = fewer_in_flight

    def pick(self, request: RoutedRequest, candidates: Sequence[Replica], score: ScoreFn | None,
             rotation: int) -> Replica:
        n = len(candidates)
        start = rotation % n
        if score is None:
            if not self.fewer_in_flight:
                return candidates[start]
            score = _no_opinion
        fewer = self.fewer_in_flight
        best, best_score, best_load = candidates[0], -math.inf, 0  # candidates[0] only if no score beats -inf (NaN)
        for offset in range(n):
            replica = candidates[(start + offset) % n]
            value = score(request, replica)
            if value > best_score or (fewer and value == best_score and replica.in_flight < best_load):
                best, best_score, best_load = replica, value, replica.in_flight
        return best


def _no_opinion(request: RoutedRequest, replica: Replica) -> float:
    return 0.0


def _implemented(parts: Sequence[Part], hook: str) -> tuple[Callable, ...]:
    """The parts' bound `hook` methods, for the parts whose class overrides the no-op (no call per request
    for a hook a part ignores)."""
    default = getattr(Part, hook)
    return tuple(getattr(part, hook) for part in parts if getattr(type(part), hook) is not default)


class Pipeline(RoutingPolicy):
    """Filters, then scorers with weights, then a picker; the lifecycle hooks go to every part.

    `parts` are extra state holders that hear the hooks without scoring (engine figures that
    several scorers read); each distinct part hears each event once."""

    name = "pipeline"

    def __init__(self, scorers: Sequence[tuple[float, Scorer]] = (), *, filters: Sequence[Filter] = (),
                 picker: Picker | None = None, parts: Sequence[Part] = ()) -> None:
        self.scorers = tuple(scorers)
        self.filters = tuple(filters)
        self.picker = picker or HighestScore()
        unique: dict[int, Part] = {}
        for part in (*(scorer for _, scorer in self.scorers), *parts):
            unique.setdefault(id(part), part)
        self.parts = tuple(unique.values())
        self.uses_prefix_hashes = any(part.uses_prefix_hashes for part in self.parts)
        self.uses_engine_load = any(part.uses_engine_load for part in self.parts)
        self.rotation = 0  # moves by one per choice: where the picker starts looking
        self._score = weighted_sum(self.scorers)
        self._pick = self.picker.pick
        self._keep = tuple(f.keep for f in self.filters)
        self._prepare = _implemented(self.parts, "prepare")
        self._on_dispatch = _implemented(self.parts, "on_dispatch")
        self._on_first_token = _implemented(self.parts, "on_first_token")
        self._on_finish = _implemented(self.parts, "on_finish")
        self._on_load_update = _implemented(self.parts, "on_load_update")
        self._forget = _implemented(self.parts, "forget")

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        self.rotation += 1
        if self._keep:
            for keep in self._keep:
                candidates = keep(request, candidates)
        if self._prepare:
            for prepare in self._prepare:
                prepare(request, candidates)
        return self._pick(request, candidates, self._score, self.rotation)

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        for hook in self._on_dispatch:
            hook(request, replica)

    def on_first_token(self, request: RoutedRequest, replica: Replica) -> None:
        for hook in self._on_first_token:
            hook(request, replica)

    def on_finish(self, request: RoutedRequest, replica: Replica, outcome: Outcome) -> None:
        for hook in self._on_finish:
            hook(request, replica, outcome)

    def on_load_update(self, replica: Replica, load: EngineLoad) -> None:
        for hook in self._on_load_update:
            hook(replica, load)

    def forget(self, replica: Replica) -> None:
        for hook in self._forget:
            hook(replica)
