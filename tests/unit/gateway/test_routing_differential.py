"""Every routing policy chooses, on the same inputs, exactly what it chose before routing became a pipeline.

A randomized differential test. The old module, kept frozen in reference_policies.py (a verbatim
copy of the deleted gateway/policies.py, in tests only as this test's oracle), and the pipelines of
gateway/routing/ are driven by one random sequence of events: requests (prefixes shared in part,
images, sessions, sizes), dispatches to a random healthy subset, first tokens with and without the
engine's own prompt count, finishes (completed, abandoned, failed and retried elsewhere), engine
scrapes (fresh, stale, NaN), replicas that drain and leave and replicas that join. Every choice
must be the same replica, and what the policies count must agree at the end.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from tests.unit.gateway import reference_policies as before
from vlmserve.gateway.breaker import CircuitBreaker
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.engine_metrics import EngineLoad
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing import (
    EngineAware,
    ImageAffinity,
    LeastOutstandingTokens,
    Outcome,
    PrefixAffinity,
    RoundRobin,
    RoutingPolicy,
    SessionAffinity,
    build_policy,
)
from vlmserve.routing import GATEWAY_POLICIES

SEEDS = range(16)
STEPS = 800
IMAGES = [f"img-{n}" for n in range(6)]
AGES_S = (0.0, 1.0, 2.95, 3.05, 60.0)  # of a scrape when it arrives: either side of the 3 s staleness


@dataclass
class Tally:
    """How much of the policies' behaviour a run exercised (so a pass is not a vacuous one)."""

    choices: int = 0
    retries: int = 0
    forgotten: int = 0
    chosen: set[int] = field(default_factory=set)


def replica(index: int) -> Replica:
    return Replica(index=index, url=f"http://10.0.0.{index}:8000", breaker=CircuitBreaker(), healthy=True)


def random_request(rng: random.Random, n: int) -> RoutedRequest:
    """A chat turn: a document's leading blocks (shared with other turns up to a random point), images, a session."""
    document, blocks = rng.randrange(5), rng.randrange(6)
    shared = rng.randint(0, blocks)
    hashes = [document * 1000 + k for k in range(shared)] + [n * 1000 + k for k in range(shared, blocks)]
    digests = rng.sample(IMAGES, rng.choice([0, 0, 1, 1, 2, 3]))
    return RoutedRequest(
        request_id=f"r{n}",
        model="m",
        stream=True,
        prompt_tokens=rng.randint(1, 4000),
        expected_output_tokens=rng.randint(1, 1000),
        prefix_hashes=hashes,
        image_digests=digests,
        image_tokens=rng.choice([60, 576]) * len(digests),
        session_id=rng.choice([None, None, None, "alice", "bob", "carol", "dave"]),
    )


class Clock:
    """time.monotonic for both policies: moves only when the test says, so staleness is decided alike."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def random_load(rng: random.Random, now: float) -> EngineLoad:
    kv = rng.random() if rng.random() > 0.25 else math.nan  # an engine that reports NaN
    return EngineLoad(
        waiting=rng.choice([0.0, float(rng.randrange(20))]),
        running=float(rng.randrange(40)),
        kv_usage=kv,
        scraped_at=now - rng.choice(AGES_S),
    )


def drive(old: before.RoutingPolicy, new: RoutingPolicy, rng: random.Random, clock: Clock) -> Tally:
    """One random life of a gateway, both policies fed the same events; fails at the first different choice."""
    replicas = [replica(i) for i in range(rng.randint(1, 5))]
    next_index = len(replicas)
    flights: list[tuple[RoutedRequest, Replica]] = []
    tally = Tally()

    def choose_and_dispatch(request: RoutedRequest, exclude: set[int]) -> None:
        pool = [r for r in replicas if r.index not in exclude]
        if not pool:
            return
        keep = rng.choice([0.9, 0.5])  # health, breakers, model
        candidates = [r for r in pool if rng.random() < keep] or [rng.choice(pool)]
        expected = old.choose(request, candidates)
        chosen = new.choose(request, candidates)
        assert chosen is expected, (tally.choices, request, [(r.index, r.in_flight) for r in candidates])
        tally.choices += 1
        tally.chosen.add(chosen.index)
        chosen.in_flight += 1
        old.on_dispatch(request, chosen)
        new.on_dispatch(request, chosen)
        flights.append((request, chosen))

    for n in range(STEPS):
        clock.now += 0.02
        roll = rng.random()
        if roll < 0.4 or not flights:
            choose_and_dispatch(random_request(rng, n), set())
        elif roll < 0.55:
            request, at = rng.choice(flights)
            if rng.random() < 0.6:
                request.engine_prompt_tokens = rng.randint(1, 6000)
            old.on_first_token(request, at)
            new.on_first_token(request, at)
        elif roll < 0.8:
            request, at = flights.pop(rng.randrange(len(flights)))
            outcome = rng.choice(list(Outcome))
            at.in_flight -= 1
            old.on_finish(request, at, before.Outcome(outcome.value))
            new.on_finish(request, at, outcome)
            if outcome is Outcome.FAILED and rng.random() < 0.7:  # the proxy retries elsewhere
                tally.retries += 1
                choose_and_dispatch(request, {at.index})
        elif roll < 0.93:
            at = rng.choice(replicas)
            load = random_load(rng, clock.now)
            old.on_load_update(at, load)
            new.on_load_update(at, load)
        else:
            idle = [r for r in replicas if r.in_flight == 0]
            if rng.random() < 0.5 and len(replicas) > 1 and idle:  # drained and left
                leaver = rng.choice(idle)
                replicas.remove(leaver)
                old.forget(leaver)
                new.forget(leaver)
                tally.forgotten += 1
            elif len(replicas) < 7:
                replicas.append(replica(next_index))
                next_index += 1
    return tally


def assert_same_counts(old: before.RoutingPolicy, new: RoutingPolicy) -> None:
    """What the policies keep that the gateway shows (/metrics, counters) or routes by later."""
    if isinstance(old, before.SessionAffinity):
        assert isinstance(new, SessionAffinity)
        assert list(new._sessions.items()) == list(old._sessions.items())
        old, new = old.inner, new.inner
    assert SAME_AS.get(new.name, new.name) == old.name
    assert new.uses_prefix_hashes == old.uses_prefix_hashes
    assert new.uses_engine_load == old.uses_engine_load or new.name in SAME_AS  # adapter-affinity reads LoRA figures
    if isinstance(old, before.LeastOutstandingTokens):
        assert isinstance(new, LeastOutstandingTokens) and new.outstanding == old.outstanding
    for counter in ("affinity_hits", "bound_overrides", "affinity_declined"):
        assert getattr(new, counter, None) == getattr(old, counter, None), counter


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Both modules read time.monotonic (engine-aware staleness); a shared fake one makes them agree."""
    fake = Clock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


SAME_AS = {"adapter-affinity": "least-outstanding-tokens"}
"""Policies newer than the reference, and the reference policy they must match on these requests (no adapter)."""


@pytest.mark.parametrize("name", GATEWAY_POLICIES)
def test_every_policy_name_chooses_as_before(name: str, clock: Clock) -> None:
    """Through build_policy, as the gateway builds them (session affinity on top), at several load factors."""
    exercised = Tally()
    for seed in SEEDS:
        rng = random.Random(f"{name}-{seed}")
        config = GatewayConfig(replicas=["http://127.0.0.1:1"], policy=name, prefix_load_factor=rng.choice([1.0, 1.25, 2.0, 4.0]))
        old = before.build_policy(replace(config, policy=SAME_AS.get(name, name)))
        new = build_policy(config)
        tally = drive(old, new, rng, clock)
        assert_same_counts(old, new)
        exercised.choices += tally.choices
        exercised.retries += tally.retries
        exercised.forgotten += tally.forgotten
        exercised.chosen |= tally.chosen
    assert exercised.choices > 5000 and exercised.retries > 50 and exercised.forgotten > 15
    assert len(exercised.chosen) > 7  # choices spread over replicas old and new


PolicyPair = Callable[[random.Random], tuple[before.RoutingPolicy, RoutingPolicy]]

KNOBS: dict[str, PolicyPair] = {
    # small LRUs, so eviction decides too; weights and factors off their defaults
    "prefix-small-lru": lambda rng: (
        before.PrefixAffinity(load_factor=(f := rng.uniform(1.0, 3.0)), blocks_per_replica=(b := rng.randint(1, 8))),
        PrefixAffinity(load_factor=f, blocks_per_replica=b),
    ),
    "image-small-lru": lambda rng: (
        before.ImageAffinity(
            load_factor=(f := rng.uniform(1.0, 3.0)),
            images_per_replica=(i := rng.randint(1, 4)),
            hit_weight=(w := rng.uniform(0.0, 5.0)),
        ),
        ImageAffinity(load_factor=f, images_per_replica=i, hit_weight=w),
    ),
    "engine-weights": lambda rng: (  # image_weight stays 1: (w × held) / n and w × (held / n) may differ in the last bit
        before.EngineAware(
            queue_weight=(q := rng.uniform(0, 3)),
            waiting_weight=(w := rng.uniform(0, 3)),
            kv_weight=(k := rng.uniform(0, 3)),
            load_factor=(f := rng.uniform(1.0, 3.0)),
        ),
        EngineAware(queue_weight=q, waiting_weight=w, kv_weight=k, load_factor=f),
    ),
    "round-robin-bare": lambda rng: (before.RoundRobin(), RoundRobin()),
    "session-small": lambda rng: (
        before.SessionAffinity(before.LeastOutstandingTokens(), load_factor=(f := rng.uniform(1.0, 3.0)), max_sessions=2),
        SessionAffinity(LeastOutstandingTokens(), load_factor=f, max_sessions=2),
    ),
}


@pytest.mark.parametrize("case", KNOBS)
def test_policies_with_other_knobs_choose_as_before(case: str, clock: Clock) -> None:
    for seed in SEEDS:
        rng = random.Random(f"{case}-{seed}")
        old, new = KNOBS[case](rng)
        tally = drive(old, new, rng, clock)
        assert tally.choices > 300
        assert_same_counts(old, new)
