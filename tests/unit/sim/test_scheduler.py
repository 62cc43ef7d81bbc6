"""The scheduler model on a virtual clock: vLLM V1's rules, and the load behaviour they produce."""

from __future__ import annotations

import random

import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.roofline import make_step_cost_model
from vlmserve.sched.constant import ConstantLatencyScheduler
from vlmserve.sched.kv_cache import BlockPool, hash_request_blocks
from vlmserve.sched.parametric_cost import PROFILES, ParametricStepCost, get_profile
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import SimulationStats, simulate

UNIT_COST = ParametricStepCost(fixed_s=0.010, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4, per_kv_token_s=0.0)


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(100_000) for _ in range(length)]


def _poisson_requests(rate_per_s: float, count: int, prompt_len: int, output_len: int, seed: int = 0) -> list[SimRequest]:
    rng = random.Random(seed)
    now = 0.0
    requests = []
    for index in range(count):
        now += rng.expovariate(rate_per_s)
        requests.append(SimRequest(f"r{index}", _prompt(rng, prompt_len), output_len, arrival_s=now))
    return requests


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_token_budget_chunks_long_prefills_and_running_goes_first() -> None:
    config = SchedulerConfig(max_num_batched_tokens=100, num_kv_blocks=256, max_model_len=1024)
    scheduler = Scheduler(config, UNIT_COST)
    rng = random.Random(1)
    scheduler.add_request(SimRequest("a", _prompt(rng, 250), 3))
    first = scheduler.step(0.0)
    assert first.contents.prefill_tokens == 100 and first.tokens == []  # chunked: 100 of 250
    second = scheduler.step(first.end_s)
    scheduler.add_request(SimRequest("b", _prompt(rng, 80), 2))
    third = scheduler.step(second.end_s)
    # 'a' finishes its prompt (50 tokens) and emits its first token; 'b' gets the remaining 50.
    assert third.contents.prefill_tokens == 100
    assert third.tokens == [("a", 1)] and third.first_token == ["a"]
    fourth = scheduler.step(third.end_s)
    # 'a' decodes (1 token) before 'b' finishes its prompt (30 tokens): running first.
    assert fourth.contents.decode_seqs == 1 and fourth.contents.prefill_tokens == 30
    assert [request_id for request_id, _ in fourth.tokens] == ["a", "b"]


def test_max_num_seqs_caps_the_running_batch() -> None:
    config = SchedulerConfig(max_num_seqs=3, num_kv_blocks=512, max_model_len=1024)
    scheduler = Scheduler(config, UNIT_COST)
    rng = random.Random(2)
    for index in range(5):
        scheduler.add_request(SimRequest(f"r{index}", _prompt(rng, 20), 50))
    result = scheduler.step(0.0)
    assert result.num_running == 3 and result.num_waiting == 2


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room() -> None:
    config = SchedulerConfig(max_num_batched_tokens=1024, num_kv_blocks=512, max_model_len=1024, enable_chunked_prefill=False)
    scheduler = Scheduler(config, UNIT_COST)
    rng = random.Random(3)
    scheduler.add_request(SimRequest("a", _prompt(rng, 600), 5))
    scheduler.add_request(SimRequest("b", _prompt(rng, 600), 5))
    result = scheduler.step(0.0)
    assert result.contents.prefill_tokens == 600 and result.num_waiting == 1


def test_knee_ttft_and_queueing_rise_and_throughput_levels_off() -> None:
    """Offline: sweep the arrival rate past capacity; the knee appears as vLLM's would."""
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, num_kv_blocks=8192)
    cost = get_profile("h100-8b")
    rows = []
    for rate in (2.0, 8.0, 32.0, 64.0, 128.0):
        requests = _poisson_requests(rate, 300, prompt_len=512, output_len=128, seed=7)
        timings = simulate(requests, config, cost, record_token_times=False)
        span = max(t.finished_s for t in timings) - min(t.arrival_s for t in timings)
        rows.append(
            {
                "rate": rate,
                "ttft_p50": _percentile([t.ttft_s for t in timings], 0.5),
                "queue_p50": _percentile([t.queue_time_s for t in timings], 0.5),
                "throughput": sum(t.output_tokens for t in timings) / span,
            }
        )
    ttfts = [row["ttft_p50"] for row in rows]
    queues = [row["queue_p50"] for row in rows]
    throughputs = [row["throughput"] for row in rows]
    assert ttfts == sorted(ttfts) and ttfts[-1] > 20 * ttfts[0], rows
    assert queues[-1] > 1.0 and queues[0] < 0.05, rows
    # Below the knee throughput follows the offered load; above it, it stops growing.
    assert throughputs[1] > 3.5 * throughputs[0], rows
    assert throughputs[-1] < 1.15 * throughputs[-2], rows
    assert throughputs[-1] < 0.5 * 128.0 * 128, rows  # far below the offered 16k tokens/s


def test_a_too_small_kv_cache_preempts_and_everyone_still_finishes() -> None:
    config = SchedulerConfig(num_kv_blocks=160, max_model_len=1024, max_num_batched_tokens=4096)
    rng = random.Random(4)
    requests = [SimRequest(f"r{index}", _prompt(rng, 300), 400) for index in range(12)]
    stats = SimulationStats()
    timings = simulate(requests, config, UNIT_COST, stats=stats)
    assert stats.num_preemptions > 0
    assert all(t.output_tokens == 400 and t.finished_s is not None for t in timings)
    assert any(t.num_preemptions > 0 for t in timings)
    # vLLM preempts the most recently admitted request first: the first request never is.
    assert timings[0].num_preemptions == 0


def test_roomy_kv_cache_never_preempts() -> None:
    config = SchedulerConfig(num_kv_blocks=8192, max_model_len=1024)
    rng = random.Random(4)
    requests = [SimRequest(f"r{index}", _prompt(rng, 300), 400) for index in range(12)]
    stats = SimulationStats()
    simulate(requests, config, UNIT_COST, stats=stats)
    assert stats.num_preemptions == 0


def test_repeated_prefix_hits_the_cache_in_full_blocks() -> None:
    rng = random.Random(5)
    shared = _prompt(rng, 1000)
    requests = [SimRequest(f"r{index}", shared + _prompt(rng, 40), 8, arrival_s=index * 1.0) for index in range(5)]
    stats = SimulationStats()
    timings = simulate(requests, SchedulerConfig(), UNIT_COST, stats=stats)
    assert timings[0].cached_prompt_tokens == 0
    # 1000 shared tokens = 62 full blocks of 16 = 992 tokens reusable
    assert [t.cached_prompt_tokens for t in timings[1:]] == [992] * 4
    assert stats.prefix_hits_tokens == 4 * 992
    assert stats.prefix_queries_tokens == 5 * 1040
    assert timings[1].ttft_s < timings[0].ttft_s


def test_prefix_caching_off_means_no_hits() -> None:
    rng = random.Random(5)
    shared = _prompt(rng, 1000)
    requests = [SimRequest(f"r{index}", shared, 8, arrival_s=index * 1.0) for index in range(3)]
    stats = SimulationStats()
    simulate(requests, SchedulerConfig(enable_prefix_caching=False), UNIT_COST, stats=stats)
    assert stats.prefix_hits_tokens == 0


def test_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    rng = random.Random(6)
    prompt = _prompt(rng, 64)  # exactly 4 blocks
    timings = simulate(
        [SimRequest("a", prompt, 2, arrival_s=0.0), SimRequest("b", list(prompt), 2, arrival_s=1.0)], SchedulerConfig(), UNIT_COST
    )
    assert timings[1].cached_prompt_tokens == 48  # 3 blocks: the 4th holds the last token


def test_block_pool_evicts_least_recently_freed_cached_block() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_block(blocks[0], 111)
    pool.cache_full_block(blocks[1], 222)
    pool.free_blocks(blocks[::-1])  # tail first, as a request frees
    assert pool.get_usage() == 0.0 and pool.get_cached_block(111) == blocks[0]
    pool.get_new_blocks(3)  # two never-used blocks, then the oldest freed one: block of 222
    assert pool.get_cached_block(222) is None and pool.get_cached_block(111) == blocks[0]


def test_block_hashes_chain_on_the_prefix() -> None:
    first = hash_request_blocks([1] * 16 + [2] * 16, 16)
    second = hash_request_blocks([9] * 16 + [2] * 16, 16)
    assert first[1] != second[1]  # same block tokens, different parent
    assert hash_request_blocks([1] * 16 + [2] * 16 + [3] * 5, 16) == first  # partial block not hashed


def test_abort_frees_blocks_and_the_request_vanishes() -> None:
    scheduler = Scheduler(SchedulerConfig(num_kv_blocks=64, max_model_len=1024), UNIT_COST)
    scheduler.add_request(SimRequest("a", list(range(100)), 50))
    scheduler.step(0.0)
    assert scheduler.kv_usage > 0
    scheduler.abort_request("a")
    assert scheduler.kv_usage == 0 and not scheduler.has_work()


def test_requests_that_can_never_run_are_refused() -> None:
    scheduler = Scheduler(SchedulerConfig(max_model_len=100, num_kv_blocks=64), UNIT_COST)
    with pytest.raises(ValueError, match="max_model_len"):
        scheduler.add_request(SimRequest("a", list(range(90)), 20))
    with pytest.raises(ValueError, match="cannot hold one request"):
        Scheduler(SchedulerConfig(max_model_len=4096, num_kv_blocks=8), UNIT_COST)


def test_simulation_is_deterministic() -> None:
    requests = _poisson_requests(40.0, 100, prompt_len=200, output_len=50, seed=3)
    config = SchedulerConfig(max_num_seqs=16, num_kv_blocks=400, max_model_len=1024)
    first = simulate(requests, config, UNIT_COST)
    second = simulate(requests, config, UNIT_COST)
    assert [(t.first_token_s, t.finished_s) for t in first] == [(t.first_token_s, t.finished_s) for t in second]


def test_simulated_records_are_request_records() -> None:
    timings = simulate([SimRequest("a", list(range(40)), 5)], SchedulerConfig(), UNIT_COST)
    record = timings[0].to_request_record(requested_output_tokens=5)
    assert record.simulated and record.ok and record.output_tokens == 5 and len(record.chunk_times_s) == 5
    assert record.ttft_s == pytest.approx(timings[0].ttft_s)


def test_constant_latency_scheduler_times_each_request_alone() -> None:
    scheduler = ConstantLatencyScheduler(ttft_s=0.1, itl_s=0.02, max_num_seqs=1)
    scheduler.add_request(SimRequest("a", [1, 2, 3], 3, arrival_s=0.0))
    scheduler.add_request(SimRequest("b", [1, 2, 3], 1, arrival_s=0.0))
    now, emitted = 0.0, []
    while scheduler.has_work():
        due = scheduler.next_event_s(now)
        assert due is not None
        now = due
        result = scheduler.step(now)
        emitted += [(request_id, round(now, 6)) for request_id, _ in result.tokens]
    assert emitted == [("a", 0.1), ("a", 0.12), ("a", 0.14), ("b", 0.24)]  # b waited for a's seat


def test_profiles_are_documented_and_unknown_names_are_user_errors() -> None:
    assert {"tiny-cpu", "a10g-8b", "h100-8b"} <= set(PROFILES)
    assert all(profile.description for profile in PROFILES.values())
    assert make_step_cost_model(None) is PROFILES["tiny-cpu"]
    with pytest.raises(UserError, match="unknown sim profile 'nope'; choose one of"):
        get_profile("nope")
