"""The frontend model: API servers as an M/G/N queue, the multimodal cache, and their effect on simulated runs."""

from __future__ import annotations

import pytest

from vlmserve.sched.frontend import Frontend, FrontendConfig
from vlmserve.sched.parametric_cost import ParametricStepCost
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import Send, run_virtual_clock

MP = 1_000_000


def test_a_repeat_skips_preprocessing_and_a_busy_server_makes_others_wait() -> None:
    frontend = Frontend(FrontendConfig(api_server_count=1, per_image_ms=10, per_megapixel_ms=20))
    first = frontend.admit(0.0, [(1, MP)])
    assert (first.start_s, first.ready_s, first.hits) == (0.0, pytest.approx(0.030), 0)
    second = frontend.admit(0.0, [(2, 2 * MP)])  # waits for the only server
    assert second.start_s == pytest.approx(0.030) and second.ready_s == pytest.approx(0.080)
    repeat = frontend.admit(0.0, [(1, MP)])  # cached: no server needed
    assert repeat.ready_s == 0.0 and repeat.hits == 1 and repeat.fresh_images == 0
    assert (frontend.queries, frontend.hits) == (3, 1)


def test_more_api_servers_run_in_parallel_and_the_cache_evicts_least_recent() -> None:
    frontend = Frontend(FrontendConfig(api_server_count=2, per_image_ms=10, mm_cache_items=2))
    visits = [frontend.admit(0.0, [(digest, 1)]) for digest in (1, 2, 3)]
    assert [round(v.ready_s, 3) for v in visits] == [0.01, 0.01, 0.02]
    assert frontend.admit(1.0, [(1, 1)]).hits == 0  # evicted by 3
    assert frontend.admit(1.0, [(3, 1)]).hits == 1


def test_config_problems_name_the_flag() -> None:
    problems = FrontendConfig(api_server_count=0, per_image_ms=-1, mm_cache_items=-2).validate()
    assert any("--api-server-count must be at least 1" in p for p in problems)
    assert any("must not be negative" in p for p in problems)
    assert any("--mm-cache-items" in p for p in problems)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (
            FrontendConfig(per_image_ms=float("nan")),
            "--mm-preprocess-ms-per-image must be a finite number of milliseconds, got nan",
        ),
        (
            FrontendConfig(per_megapixel_ms=float("inf")),
            "--mm-preprocess-ms-per-megapixel must be a finite number of milliseconds, got inf",
        ),
        (FrontendConfig(per_image_ms=1e300), "--mm-preprocess-ms-per-image must be at most 3600000 (an hour), got 1e+300"),
        (FrontendConfig(api_server_count=10**9), "--api-server-count must be at most 1024, got 1000000000"),
        (FrontendConfig(mm_cache_items=10**12), "--mm-cache-items must be at most 10000000, got 1000000000000"),
    ],
)
def test_hostile_values_are_refused_before_they_cost_memory_or_poison_clocks(config: FrontendConfig, problem: str) -> None:
    assert config.validate() == [problem]


def test_zero_costs_are_allowed_and_mean_no_preprocessing_time() -> None:
    config = FrontendConfig(per_image_ms=0.0, per_megapixel_ms=0.0)
    assert config.validate() == []
    assert Frontend(config).admit(3.0, [(1, MP)]).ready_s == 3.0


COST = ParametricStepCost(
    fixed_s=0.002, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4, per_kv_token_s=0.0, per_image_token_s=2e-5
)


def _image_request(index: int, digest: int, arrival_s: float) -> SimRequest:
    return SimRequest(
        request_id=str(index),
        prompt_token_ids=list(range(index * 10_000, index * 10_000 + 300)),
        max_output_tokens=4,
        arrival_s=arrival_s,
        image_tokens=256,
        images=1,
        image_items=((digest, 4 * MP),),
    )


def _run(requests: list[SimRequest], frontend: FrontendConfig):
    cores = [Scheduler(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192, num_kv_blocks=4096), COST)]
    sends = [Send(request.arrival_s, index, request) for index, request in enumerate(requests)]
    timings, stats = run_virtual_clock(cores, sends, frontend=frontend)
    return [timings[request.request_id] for request in requests], stats[0]


def test_a_repeated_images_ttft_is_lower_by_preprocessing_and_encoder_time() -> None:
    config = FrontendConfig(per_image_ms=20, per_megapixel_ms=10)  # 60 ms for a 4 MP image
    (fresh, repeat), stats = _run([_image_request(0, 7, 0.0), _image_request(1, 7, 1.0)], config)
    saved = fresh.ttft_s - repeat.ttft_s
    encoder_s = 256 * 2e-5
    assert saved == pytest.approx(0.060 + encoder_s, rel=0.02)
    assert fresh.frontend_s == pytest.approx(0.060) and repeat.frontend_s == 0.0
    assert (stats.mm_cache_queries, stats.mm_cache_hits) == (2, 1)


def test_past_the_frontends_capacity_ttft_grows_while_the_engine_queue_stays_short() -> None:
    config = FrontendConfig(per_image_ms=50)  # one server: 20 images/s at most

    def run(rate: float) -> list:
        requests = [_image_request(i, 1000 + i, i / rate) for i in range(60)]
        return _run(requests, config)[0]

    below, above = run(10.0), run(40.0)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    assert mean([t.ttft_s for t in above]) > 5 * mean([t.ttft_s for t in below])
    assert max(t.queue_time_s for t in above) < 0.05  # the scheduler's queue stays short
    assert mean([t.frontend_s for t in above]) > 0.5  # the wait is in the frontend
