"""The routing pipeline's own rules: weighted sums, ties, which parts hear which events.

(That each `--policy` name still chooses as before is test_routing_differential.py's job.)
"""

from __future__ import annotations

from collections import Counter

from vlmserve.gateway.breaker import CircuitBreaker
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing import (
    EngineAware,
    Lifecycle,
    Outcome,
    OutstandingTokens,
    Pipeline,
    PrefixAffinity,
    RoundRobin,
    Scorer,
    fewer_in_flight_first,
    under_load_bound,
)


def make_replicas(n: int) -> list[Replica]:
    return [Replica(index=i, url=f"http://127.0.0.1:{9000 + i}", breaker=CircuitBreaker(), healthy=True) for i in range(n)]


def req(request_id: str, prompt: int = 100, output: int = 50) -> RoutedRequest:
    return RoutedRequest(request_id=request_id, model="m", stream=True, prompt_tokens=prompt, expected_output_tokens=output)


class Holds(Scorer):
    """1 on the replicas that hold something the request wants (a LoRA adapter, say), else 0."""

    def __init__(self, indices: set[int]) -> None:
        self.indices = indices

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        return 1.0 if replica.index in self.indices else 0.0


def test_a_new_signal_is_one_weighted_scorer_and_its_weight_decides_against_load() -> None:
    replicas = make_replicas(3)
    tokens = OutstandingTokens(half_score_tokens=1000)
    busy = req("busy", prompt=2000, output=1000)  # replica 1 holds 3,000 tokens: load score 0.25
    tokens.on_dispatch(busy, replicas[1])
    strong = Pipeline([(1.0, tokens), (1.0, Holds({1}))], picker=fewer_in_flight_first)
    weak = Pipeline([(1.0, tokens), (0.5, Holds({1}))], picker=fewer_in_flight_first)
    assert strong.choose(req("a"), replicas) is replicas[1]  # 0.25 + 1.0 beats 1.0 idle
    assert weak.choose(req("b"), replicas) is not replicas[1]  # 0.25 + 0.5 does not


def test_equal_sums_rotate_and_fewer_in_flight_breaks_them_first() -> None:
    replicas = make_replicas(3)
    plain = Pipeline([(0.5, Holds(set()))])
    picks = Counter(plain.choose(req(f"r{i}"), replicas).index for i in range(30))
    assert picks == {0: 10, 1: 10, 2: 10}
    replicas[0].in_flight = replicas[2].in_flight = 1
    idle_first = Pipeline(picker=fewer_in_flight_first)  # no scorer: every sum is equal
    assert {idle_first.choose(req(f"i{i}"), replicas).index for i in range(6)} == {1}


class Listener(Lifecycle):
    """Counts the events it hears; implements only dispatch and forget."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    def on_dispatch(self, request: RoutedRequest, replica: Replica) -> None:
        self.heard.append(f"dispatch {request.request_id}")

    def forget(self, replica: Replica) -> None:
        self.heard.append(f"forget {replica.index}")


class ReadsListener(Scorer):
    def __init__(self, shared: Listener) -> None:
        self.shared = shared

    def score(self, request: RoutedRequest, replica: Replica) -> float:
        return 0.0


def test_a_part_shared_by_two_scorers_hears_each_event_once_and_only_those_it_implements() -> None:
    replicas = make_replicas(2)
    shared = Listener()
    pipeline = Pipeline([(1.0, ReadsListener(shared)), (1.0, ReadsListener(shared))], parts=(shared, shared))
    assert pipeline.parts.count(shared) == 1
    assert pipeline.on_dispatch == shared.on_dispatch and pipeline.forget == shared.forget  # bound once: no loop per event
    request = req("x")
    chosen = pipeline.choose(request, replicas)
    pipeline.on_dispatch(request, chosen)
    pipeline.on_first_token(request, chosen)
    pipeline.on_finish(request, chosen, Outcome.COMPLETED)
    pipeline.forget(replicas[1])
    assert shared.heard == ["dispatch x", "forget 1"]


def test_a_pipeline_asks_for_prefix_hashes_and_engine_scrapes_only_when_a_part_reads_them() -> None:
    assert PrefixAffinity().uses_prefix_hashes and not PrefixAffinity().uses_engine_load
    assert EngineAware().uses_engine_load and not EngineAware().uses_prefix_hashes
    assert not RoundRobin().uses_prefix_hashes and not RoundRobin().uses_engine_load


def test_the_load_bound_never_empties_the_candidates() -> None:
    replicas = make_replicas(3)
    for replica in replicas:
        replica.in_flight = 5
    assert under_load_bound(load_factor=0.5)(req("r"), replicas) == replicas  # below fair share: nobody fits
    replicas[0].in_flight = 0
    assert under_load_bound(load_factor=1.0)(req("r"), replicas) == [replicas[0]]


def test_round_robin_reads_nothing_of_the_request() -> None:
    """The app rotates requests without routing details (/version and the like) with it, passing None."""
    replicas = make_replicas(3)
    rotation = RoundRobin()
    assert [rotation.choose(None, replicas).index for _ in range(4)] == [1, 2, 0, 1]  # type: ignore[arg-type]
