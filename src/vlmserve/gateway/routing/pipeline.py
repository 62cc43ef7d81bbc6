"""Routing as a pipeline: filters, then weighted scorers (each 0..1), then a picker.

llm-d's endpoint picker and SGLang's router route this way. A filter drops replicas that must not
take the request (over a load bound); each scorer rates every replica left in 0..1, higher better
(little load, the request's prefix cached, its images held); the picker takes the highest weighted
sum and says how ties go. A new signal is one Scorer given a weight, not a new policy; the policies
named on the command line are fixed pipelines (build.py). The replicas a pipeline sees are already
filtered for health, ejection and model (ReplicaPool.candidates).

Scorers keep their own state from a request's life through the hooks of `Lifecycle`; filters and
pickers keep none, so they are plain functions. `choose` runs on the event loop for every request,
so the pipeline works out once, at construction, which hooks each part really implements and per
request calls only those; a one-scorer pipeline costs one `score` call per replica more than a
hand-written loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing.policy import HOOKS, Lifecycle, RoutingPolicy

ScoreFn = Callable[[RoutedRequest, Replica], float]
"""A replica's score for a request: one scorer's, or the pipeline's weighted sum."""

Filter = Callable[[RoutedRequest, Sequence[Replica]], Sequence[Replica]]
"""Narrows the candidates before scoring; must never return an empty list for a non-empty one."""

Picker = Callable[[RoutedRequest, Sequence[Replica], ScoreFn | None, int], Replica]
"""Takes one replica by the weighted sum (None: no scorers, every replica ties), given a rotation
that moves by one per choice; says how ties go."""


class Scorer(Lifecycle):
    """One opinion about a replica for a request: 0 (worst) to 1 (best)."""

    def prepare(self, request: RoutedRequest, candidates: Sequence[Replica]) -> None:
        """Once per choice, after the filters and before any score: figures shared by all the
        replicas' scores (the maxima to normalise by, a load bound), computed once, not per replica."""

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        raise NotImplementedError


def weighted_sum(scorers: Sequence[tuple[float, Scorer]]) -> ScoreFn | None:
    """The sum of weight × score, as one function built once per pipeline, added in the scorers' order.

    A lone scorer of weight 1 is its own `score`, so a one-scorer pipeline pays one call per replica
    and nothing more; None when there is no scorer."""
    if not scorers:
        return None
    if len(scorers) == 1 and scorers[0][0] == 1.0:
        return scorers[0][1].score
    parts = tuple((weight, scorer.score) for weight, scorer in scorers)

    def total(request: RoutedRequest, replica: Replica) -> float:
        summed = 0.0
        for weight, score in parts:
            summed += weight * score(request, replica)
        return summed

    return total


def _highest_score_picker(fewer_in_flight: bool) -> Picker:
    """The highest weighted sum, looked for from a position that moves by one each choice.

    Equal sums go to the first replica met from that position, so equal replicas share the work
    instead of the first in the list taking it all; with no scorers this is round robin. With
    `fewer_in_flight`, equal sums go first to the replica with fewer requests in flight. (A plain
    function per flag: cheaper to call per choice than a bound method or a partial.)"""

    def pick(request: RoutedRequest, candidates: Sequence[Replica], score: ScoreFn | None, rotation: int) -> Replica:
        n = len(candidates)
        start = rotation % n
        if score is None:
            if not fewer_in_flight:
                return candidates[start]
            score = _no_opinion
        best, best_score, best_load = candidates[0], -math.inf, 0  # candidates[0] only if no score beats -inf (NaN)
        for offset in range(n):
            replica = candidates[(start + offset) % n]
            value = score(request, replica)
            if value > best_score or (fewer_in_flight and value == best_score and replica.in_flight < best_load):
                best, best_score, best_load = replica, value, replica.in_flight
        return best

    return pick


highest_score = _highest_score_picker(False)
fewer_in_flight_first = _highest_score_picker(True)


def _no_opinion(request: RoutedRequest, replica: Replica) -> float:
    return 0.0


def _implemented(parts: Sequence[Lifecycle], hook: str) -> tuple[Callable[..., None], ...]:
    """The parts' bound `hook` methods, for the parts whose class overrides the no-op (no call per request
    for a hook a part ignores)."""
    default = getattr(Scorer, hook)
    return tuple(getattr(part, hook) for part in parts if getattr(type(part), hook, default) is not default)


def _each(hooks: tuple[Callable[..., None], ...]) -> Callable[..., None]:
    """One callable for the parts' hooks: a lone hook is itself, so an event costs no loop."""
    if len(hooks) == 1:
        return hooks[0]

    def each(*args: Any) -> None:
        for hook in hooks:
            hook(*args)

    return each


class Pipeline(RoutingPolicy):
    """Filters, then scorers with weights, then a picker; the lifecycle events go to every part.

    `parts` are extra state holders that hear the events, and `prepare` where they have one, without
    scoring (engine figures that several scorers read); each distinct part hears each event once. The
    hooks are the parts' own, bound at construction, so a subclass does not override them."""

    name = "pipeline"

    def __init__(
        self,
        scorers: Sequence[tuple[float, Scorer]] = (),
        *,
        filters: Sequence[Filter] = (),
        picker: Picker = highest_score,
        parts: Sequence[Lifecycle] = (),
    ) -> None:
        self.scorers = tuple(scorers)
        self.parts = tuple({id(part): part for part in (*(scorer for _, scorer in self.scorers), *parts)}.values())
        self.uses_prefix_hashes = any(part.uses_prefix_hashes for part in self.parts)
        self.uses_engine_load = any(part.uses_engine_load for part in self.parts)
        self.rotation = 0  # moves by one per choice: where the picker starts looking
        self._filters = tuple(filters)
        self._pick = picker
        self._score = weighted_sum(self.scorers)
        self._prepare = _implemented(self.parts, "prepare")
        for hook in HOOKS:
            setattr(self, hook, _each(_implemented(self.parts, hook)))

    def choose(self, request: RoutedRequest, candidates: Sequence[Replica]) -> Replica:
        self.rotation += 1
        if self._filters:
            for keep in self._filters:
                candidates = keep(request, candidates)
        if self._prepare:
            for prepare in self._prepare:
                prepare(request, candidates)
        return self._pick(request, candidates, self._score, self.rotation)
