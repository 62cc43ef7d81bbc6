"""Adapter-aware routing: holders preferred within the load bound, hot adapters spread, rare ones find free slots."""

from __future__ import annotations

import random
import time
from collections import Counter

from vlmserve.gateway.breaker import CircuitBreaker
from vlmserve.gateway.engine_metrics import EngineLoad, parse_engine_load
from vlmserve.gateway.replicas import Replica
from vlmserve.gateway.request_info import RoutedRequest
from vlmserve.gateway.routing import AdapterAffinity, LeastOutstandingTokens, Outcome, RoutingPolicy


def replicas(n: int) -> list[Replica]:
    return [Replica(index=i, url=f"http://127.0.0.1:{9000 + i}", breaker=CircuitBreaker(), healthy=True) for i in range(n)]


def req(request_id: str, adapter: str | None, prompt: int = 100, output: int = 50) -> RoutedRequest:
    return RoutedRequest(
        request_id=request_id,
        model=adapter or "base",
        stream=True,
        prompt_tokens=prompt,
        expected_output_tokens=output,
        adapter=adapter,
    )


def send(policy: RoutingPolicy, request: RoutedRequest, pool: list[Replica]) -> Replica:
    """Choose and dispatch as the proxy does (the replica's in-flight count included)."""
    chosen = policy.choose(request, pool)
    chosen.in_flight += 1
    policy.on_dispatch(request, chosen)
    return chosen


def finish(policy: RoutingPolicy, request: RoutedRequest, replica: Replica) -> None:
    replica.in_flight -= 1
    policy.on_finish(request, replica, Outcome.COMPLETED)


def loaded(policy: RoutingPolicy, pool: list[Replica], per_replica: int = 3) -> None:
    """Base-model work on every replica, so the load bound leaves room (at 1 request in all it allows 1 each)."""
    for replica in pool:
        for index in range(per_replica):
            replica.in_flight += 1
            policy.on_dispatch(req(f"base-{replica.index}-{index}", None), replica)


def test_an_adapters_requests_follow_it_while_its_holder_is_under_the_bound() -> None:
    pool, policy = replicas(3), AdapterAffinity()
    loaded(policy, pool)
    first = send(policy, req("a1", "clinic"), pool)
    assert send(policy, req("a2", "clinic"), pool) is first  # joins the slot the adapter holds
    assert send(policy, req("a3", "clinic"), pool) is not first  # 6 in flight there: over ceil(1.25 x 12 / 3) = 5
    lot, lot_pool = LeastOutstandingTokens(), replicas(3)
    loaded(lot, lot_pool)
    assert send(lot, req("a1", "clinic"), lot_pool) is not send(lot, req("a2", "clinic"), lot_pool)  # LOT scatters it


def test_a_hot_adapter_spreads_when_its_holder_reaches_the_bound_and_never_passes_it() -> None:
    pool, policy = replicas(2), AdapterAffinity(load_factor=1.25)
    used = Counter(send(policy, req(f"h{i}", "hot"), pool).index for i in range(12))
    assert len(used) == 2  # held by both once one was saturated
    assert max(replica.in_flight for replica in pool) <= 7  # ceil(1.25 x 12 / 2): the bound held throughout


def test_a_rare_adapter_goes_where_a_slot_is_free_rather_than_behind_a_full_batch() -> None:
    for policy in (AdapterAffinity(), LeastOutstandingTokens()):
        pool = replicas(2)
        holder = send(policy, req("hot", "hot"), pool)  # fills its replica's one slot (vLLM's default max_loras)
        other = pool[1 - holder.index]
        for index in range(2):  # the other replica is busier in tokens, with base-model work that takes no slot
            other.in_flight += 1
            policy.on_dispatch(req(f"base{index}", None, prompt=1500, output=500), other)
        chosen = send(policy, req("rare", "rare"), pool)
        # least tokens alone queues it behind the hot adapter's slot; adapter affinity takes the free slot
        assert chosen is (other if isinstance(policy, AdapterAffinity) else holder), policy.name


def test_the_engines_lora_metric_tells_which_replica_runs_an_adapter() -> None:
    pool, policy = replicas(3), AdapterAffinity()
    scrape = (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 100.0\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="tutor,clinic",waiting_lora_adapters="x"} 200.0\n'
        "vllm:num_requests_running 2\n"
    )
    load = parse_engine_load(scrape, time.monotonic())
    assert load.adapters == frozenset({"tutor", "clinic", "x"}) and load.max_loras == 2 and load.running == 2
    policy.on_load_update(pool[2], load)  # another gateway's requests: this one sent nothing there
    assert send(policy, req("t", "tutor"), pool) is pool[2]
    stale = EngineLoad(0, 0, 0, time.monotonic() - 60, adapters=frozenset({"old"}), max_loras=2)
    policy.on_load_update(pool[1], stale)  # a stale scrape says nothing about now
    assert not policy.residency.running(pool[1], "old") and policy.residency.recently(pool[1], "old")


def slot_waits(policy: RoutingPolicy, seed: int, steps: int = 4000) -> int:
    """Requests that reach a replica whose slots (max_loras 2) other adapters fill: they wait for one.

    Zipf(1.1) popularity over 8 adapters, two replicas, each request in flight for 6 arrivals."""
    rng = random.Random(seed)
    pool = replicas(2)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(8)]
    running: list[tuple[int, RoutedRequest, Replica]] = []
    held: dict[int, Counter[str]] = {0: Counter(), 1: Counter()}
    waits = 0
    for step in range(steps):
        for item in [item for item in running if item[0] <= step]:
            running.remove(item)
            finish(policy, item[1], item[2])
            held[item[2].index][item[1].adapter or ""] -= 1
        adapter = f"lora-{rng.choices(range(8), weights)[0]}"
        request = req(f"r{step}", adapter, prompt=rng.randint(50, 400), output=rng.randint(20, 100))
        chosen = send(policy, request, pool)
        busy = {name for name, count in held[chosen.index].items() if count > 0}
        waits += adapter not in busy and len(busy) >= 2
        held[chosen.index][adapter] += 1
        running.append((step + 6, request, chosen))
    return waits


def test_on_a_zipf_mix_fewer_requests_wait_for_an_adapter_slot_than_under_least_outstanding_tokens() -> None:
    for seed in range(3):
        aware, plain = slot_waits(AdapterAffinity(), seed), slot_waits(LeastOutstandingTokens(), seed)
        assert aware < 0.6 * plain, (seed, aware, plain)
