"""The scheduler model's LoRA slots: more hot adapters than slots makes requests wait, as vLLM's scheduler does."""

from __future__ import annotations

import random
import statistics

import pytest

from vlmserve.sched.lora_slots import LoraConfig
from vlmserve.sched.parametric_cost import ParametricStepCost
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import simulate

COST = ParametricStepCost(fixed_s=0.010, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4, per_kv_token_s=0.0)


def requests(adapters: int, count: int = 400, rate: float = 40.0, seed: int = 0) -> list[SimRequest]:
    """Poisson arrivals spread evenly over `adapters` hot adapters (64-token prompts, 32 tokens out)."""
    rng = random.Random(seed)
    now, made = 0.0, []
    for index in range(count):
        now += rng.expovariate(rate)
        made.append(
            SimRequest(
                f"r{index}", [rng.randrange(50_000) for _ in range(64)], 32, arrival_s=now, lora=f"lora-{index % adapters}"
            )
        )
    return made


def ttft_p50(adapters: int, lora: LoraConfig | None) -> float:
    config = SchedulerConfig(max_num_batched_tokens=2048, num_kv_blocks=4096, max_model_len=2048, lora=lora)
    timings = simulate(requests(adapters), config, COST)
    return statistics.median(t.first_token_s - t.arrival_s for t in timings if t.first_token_s is not None)


def test_more_hot_adapters_than_slots_raises_ttft_and_fewer_do_not() -> None:
    slots = LoraConfig(max_loras=2, max_cpu_loras=8)
    within = ttft_p50(2, slots)  # two hot adapters, two slots: nobody waits for one
    beyond = ttft_p50(8, slots)  # eight hot adapters, two slots: requests wait while others hold them
    unlimited = ttft_p50(8, LoraConfig(max_loras=8, max_cpu_loras=8))
    assert within == pytest.approx(ttft_p50(2, None), rel=0.05)  # slots that suffice cost nothing
    assert beyond > 2 * within and beyond > 2 * unlimited


def test_a_waiting_request_without_a_slot_is_skipped_not_blocking_and_loads_cost_once() -> None:
    config = SchedulerConfig(
        max_num_batched_tokens=4096,
        num_kv_blocks=1024,
        max_model_len=1024,
        lora=LoraConfig(max_loras=1, max_cpu_loras=1, load_s=0.5),
    )
    scheduler = Scheduler(config, COST)
    scheduler.add_request(SimRequest("a1", list(range(32)), 4, lora="a"))
    scheduler.add_request(SimRequest("b1", list(range(100, 132)), 4, lora="b"))  # no slot: skipped
    scheduler.add_request(SimRequest("base", list(range(200, 232)), 4))  # the base model needs no slot
    first = scheduler.step(0.0)
    assert {request_id for request_id, _ in first.tokens} == {"a1", "base"} and scheduler.num_waiting == 1
    assert first.duration_s >= 0.5  # adapter a loaded from disk first
    second = scheduler.step(first.end_s)
    assert second.duration_s < 0.5  # a is cached now
    assert scheduler.lora_slots is not None and scheduler.lora_slots.loads_total == 1
    while scheduler.requests.get("a1") is not None:
        scheduler.step(0.0)
    third = scheduler.step(0.0)  # a1 done: b takes the slot (and evicts a from the one-adapter cache)
    assert ("b1", 1) in third.tokens and third.duration_s >= 0.5


def test_bad_lora_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_cpu_loras \\(1\\) must be at least max_loras \\(2\\)"):
        Scheduler(SchedulerConfig(lora=LoraConfig(max_loras=2, max_cpu_loras=1)), COST)
