"""Routing policies against real sim engines: balance, cache affinity, session pins, engine load."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway, scrape_engine, sim_engines
from tests.helpers.sim import SimHandle
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing import PrefixAffinity, load_bound

TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = [a + b + c for a in LETTERS for b in LETTERS for c in LETTERS]
"""Three-letter words: " abc" is one token to the sim's tokenizer and to the gateway's estimate
(4 characters a token), so a request is charged at dispatch what the engine will hold."""


async def engine_totals(session: aiohttp.ClientSession, engines: list[SimHandle]) -> list[dict[str, float]]:
    return [await scrape_engine(session, engine) for engine in engines]


def deltas(after: list[dict[str, float]], before: list[dict[str, float]], names: tuple[str, ...]) -> list[float]:
    return [sum(a.get(n, 0.0) - b.get(n, 0.0) for n in names) for a, b in zip(after, before)]


async def run_closed_loop(
    session: aiohttp.ClientSession, url: str, bodies: list[dict], concurrency: int, all_sent: asyncio.Event | None = None
) -> list:
    """Send `bodies` in order with `concurrency` requests outstanding; `all_sent` is set when the last goes."""
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    results = []

    async def worker() -> None:
        while not queue.empty():
            body = queue.get_nowait()
            if queue.empty() and all_sent is not None:
                all_sent.set()
            results.append(await post_chat(session, url, body))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def max_relative_deviation(loads: list[float]) -> float:
    mean = sum(loads) / len(loads)
    return max(abs(load - mean) / mean for load in loads)


@pytest.fixture(scope="module")
def kv_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimHandle]]:
    """Three engines with the scheduler model, so their KV-cache gauge shows the tokens they hold."""
    with sim_engines(3, tmp_path_factory.mktemp("kv-sims"), no_prefix_caching=True) as handles:
        yield handles


async def sample_kv_usage(
    session: aiohttp.ClientSession, engines: list[SimHandle], samples: list[list[float]], stop: asyncio.Event
) -> None:
    """Poll each engine's vllm:kv_cache_usage_perc (tokens resident / capacity) until stopped."""
    while not stop.is_set():
        scrapes = await asyncio.gather(*(scrape_engine(session, engine) for engine in engines))
        for scrape, series in zip(scrapes, samples):
            series.append(scrape.get("vllm:kv_cache_usage_perc", 0.0))
        await asyncio.sleep(0.01)


async def test_least_outstanding_tokens_keeps_engine_load_within_10_percent(kv_engines: list[SimHandle]) -> None:
    """Mixed sizes in a pattern that defeats round-robin (every third request is big).

    Load is what the engines themselves report: the time-averaged KV-cache usage (tokens held)
    of each replica while the workload runs. Round-robin on the start of the same sequence is
    the control that shows the measure has teeth. 60 streams over 3 replicas keep one big
    request a small share of a replica's load (balance cannot be finer than one request).
    """
    rng = random.Random(5)
    ranges = [(1200, 3600), (20, 120), (200, 800)]  # prompt tokens: every third request is a big one
    bodies = []
    for i in range(480):
        low, high = ranges[i % 3]
        words = int(low * (high / low) ** rng.random())
        # One token a word (WORDS): with words the gateway estimated at about half their engine count
        # ("w12x345", 4 tokens), a request waiting for its first token was undercharged, and the
        # spread reached 0.09 on a quiet machine and 0.15 on a loaded one.
        text = " ".join(WORDS[(1009 * i + j) % len(WORDS)] for j in range(words))
        bodies.append(chat_body(text, max_tokens=rng.choice((8, 16, 24))))
    spread = {}
    async with aiohttp.ClientSession() as session:
        for policy, workload in (("round-robin", bodies[:120]), ("least-outstanding-tokens", bodies)):
            samples: list[list[float]] = [[] for _ in kv_engines]
            stop = asyncio.Event()
            async with running_gateway(kv_engines, policy=policy) as gw:
                # Sample the steady state only: the drain at the end (fewer and fewer requests
                # left) is imbalanced by nature, whatever the policy.
                sampler = asyncio.create_task(sample_kv_usage(session, kv_engines, samples, stop))
                results = await run_closed_loop(session, gw.base_url, workload, concurrency=60, all_sent=stop)
                await sampler
            assert all(r.status == 200 and r.done for r in results)
            spread[policy] = max_relative_deviation([sum(series) / len(series) for series in samples])
    print(f"max deviation from the mean engine KV load: {spread}")
    # with one-token words it measured 0.01-0.05, quiet or loaded: the bound has room for a slow machine
    assert spread["least-outstanding-tokens"] <= 0.10, spread
    assert spread["round-robin"] > 0.3, spread  # the workload really is adversarial


@pytest.fixture(scope="module")
def cache_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimHandle]]:
    """Three engines whose KV cache each holds about a third of the workload's shared prefixes
    (12 documents of ~95 blocks; 450 blocks per engine): what affinity gives each engine fits,
    what round-robin gives each engine does not."""
    with sim_engines(3, tmp_path_factory.mktemp("cache-sims"), num_kv_blocks=450, max_model_len=2048) as handles:
        yield handles


def document(seed: int, words: int = 500) -> str:
    rng = random.Random(seed)
    vocabulary = "radiograph molar caries enamel pulp crown root canal lesion periapical bitewing".split()
    return " ".join(f"{rng.choice(vocabulary)}{rng.randint(0, 99)}" for _ in range(words))


async def test_prefix_affinity_raises_engine_cache_hits_within_the_load_bound(cache_engines: list[SimHandle]) -> None:
    """12 long shared documents, 10 questions each, shuffled: the engines report their cache hits.

    The load bound is on requests in flight when each one is routed, so that is what is checked, at
    every choice the gateway makes. Totals per replica only follow it loosely in a closed loop: a
    replica that hits its cache answers sooner and so is free more often (44-52 of 120 in runs here).

    The cache gain needs the engines to run at about the same speed (0.70-0.77 against 0.46 in runs
    here, the bound overriding affinity for 8-9 % of the choices). On a loaded runner a sim engine
    can be starved for a while; the bound then rightly sends its documents to the other two, whose
    caches cannot hold them all, and the gain shrinks for a reason that is not the policy's (seen
    once in CI: 0.52). A run whose gain falls short is run once more, on documents no engine has
    cached; a policy that lost its affinity fails both."""
    async with aiohttp.ClientSession() as session:
        round_robin = await cache_run(session, cache_engines, "round-robin", 0)
        affinity = await cache_run(session, cache_engines, "prefix-affinity", 1)
        if affinity.hit_rate < round_robin.hit_rate + 0.15:
            print(
                f"short gain ({affinity.hit_rate:.3f}, requests per replica {affinity.per_replica}, bound overrode "
                f"affinity for {affinity.overridden_share:.0%}): run again"
            )
            affinity = await cache_run(session, cache_engines, "prefix-affinity", 2)
    print(
        f"engine prefix-cache hit rate: round-robin {round_robin.hit_rate:.3f}, prefix-affinity {affinity.hit_rate:.3f}; "
        f"requests per replica: {affinity.per_replica}; bound overrode affinity for {affinity.overridden_share:.0%}"
    )
    assert affinity.hit_rate >= round_robin.hit_rate + 0.15, (round_robin, affinity)
    assert len(affinity.choices) >= affinity.requests
    assert all(in_flight <= bound for in_flight, bound in affinity.choices), affinity.choices
    fair_share = affinity.requests / len(cache_engines)
    assert max(affinity.per_replica) <= 1.5 * fair_share, affinity  # and the totals stay near even


@dataclass
class CacheRun:
    hit_rate: float
    per_replica: list[float]
    requests: int
    choices: list[tuple[int, float]]  # (in flight on the chosen replica with this request, the bound)
    overridden_share: float  # of the prefix-affinity choices, those where the load bound overrode affinity


async def cache_run(session: aiohttp.ClientSession, engines: list[SimHandle], policy: str, documents: int) -> CacheRun:
    """The workload through a gateway with `policy`, on document set `documents`; the engines' cache figures."""
    bodies = []
    for question in range(10):
        for group in range(12):
            body = chat_body(f"question {question}: what does it show?", max_tokens=2)
            body["messages"].insert(0, {"role": "system", "content": document(1000 * documents + group)})
            bodies.append(body)
    random.Random(documents).shuffle(bodies)
    choices: list[tuple[int, float]] = []
    overridden = 0.0
    async with running_gateway(engines, policy=policy, prefix_load_factor=1.25) as gw:
        chooser: Any = gw.gateway.policy  # PrefixAffinity inside the session wrapper (SessionAffinity.inner)
        if policy == "prefix-affinity":
            record_bounded_choices(chooser, choices)
        before = await engine_totals(session, engines)
        results = await run_closed_loop(session, gw.base_url, bodies, concurrency=8)
        after = await engine_totals(session, engines)
        if policy == "prefix-affinity":
            overridden = chooser.inner.bound_overrides / max(1, len(choices))
    assert all(r.status == 200 and r.done for r in results)
    hits = sum(deltas(after, before, ("vllm:prefix_cache_hits_total",)))
    queries = sum(deltas(after, before, ("vllm:prefix_cache_queries_total",)))
    return CacheRun(hits / queries, deltas(after, before, ("vllm:request_success_total",)), len(bodies), choices, overridden)


def record_bounded_choices(policy: PrefixAffinity, choices: list[tuple[int, float]]) -> None:
    """Note, at each choice, the chosen replica's requests in flight counting this one, and the bound."""
    choose = policy.choose

    def noted(request: RoutedRequest, candidates: list[Replica]) -> Replica:
        chosen = choose(request, candidates)
        choices.append((chosen.in_flight + 1, load_bound(candidates, policy.load_factor)))
        return chosen

    policy.choose = noted  # type: ignore[method-assign]


async def test_session_header_pins_a_conversation_to_one_replica(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with running_gateway(constant_engines, policy="round-robin", audit_log=audit) as gw, aiohttp.ClientSession() as session:
        for turn in range(6):
            for session_id in ("alice", "bob"):
                result = await post_chat(
                    session, gw.base_url, chat_body(f"turn {turn}", max_tokens=2), {"X-Session-ID": session_id}
                )
                assert result.status == 200
        for turn in range(6):  # without the header, round-robin spreads them
            await post_chat(session, gw.base_url, chat_body(f"anon {turn}", max_tokens=2))
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    pinned = [r["replica"] for r in records[:12]]
    assert len(set(pinned[0::2])) == 1 and len(set(pinned[1::2])) == 1
    assert len(Counter(r["replica"] for r in records[12:])) == 3


async def test_engine_aware_polls_engine_metrics_and_routes(constant_engines: list[SimHandle]) -> None:
    async with (
        running_gateway(constant_engines, policy="engine-aware", metrics_interval_s=0.2) as gw,
        aiohttp.ClientSession() as session,
    ):
        state = gw.gateway
        assert all(replica.load is not None for replica in state.pool.replicas)  # polled before serving
        results = await asyncio.gather(*(post_chat(session, gw.base_url, chat_body(f"q{i}", max_tokens=30)) for i in range(30)))
        assert all(r.status == 200 and r.done for r in results)
        spread = Counter(r.dispatched_total for r in state.pool.replicas)
        assert sum(r.dispatched_total for r in state.pool.replicas) == 30
        assert max(r.dispatched_total for r in state.pool.replicas) <= 20, spread
        async with session.get(gw.base_url + "/v1/models") as response:
            assert [m["id"] for m in (await response.json())["data"]] == [MODEL]
