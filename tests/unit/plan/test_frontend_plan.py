"""The planner models the image path: image mix and repeats in, the frontend named when it is the limit."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.explain import frontend_verdict
from vlmserve.plan.simulate import simulate_run
from vlmserve.plan.workload import ImageMix, planned_requests
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.spec import LoadSpec

CALIBRATION = Calibration(Efficiency(bandwidth=0.7, compute=0.5, step_overhead_s=0.002, request_overhead_s=0.0))
FULL_HD = (1920, 1080)


def _setup(**options) -> PlanSetup:
    return PlanSetup.from_names("qwen3-vl-4b", options.pop("gpu", "h100"), calibration=CALIBRATION, **options)


def _images(rate: float, count: int = 300, size: tuple[int, int] = FULL_HD) -> LoadSpec:
    return LoadSpec(dataset="images", input_len=128, output_len=32, rate=rate, num_requests=count, image_size=size)


def test_image_fraction_and_repeat_rate_shape_the_workload() -> None:
    load = _images(10.0, count=2000)
    requests = planned_requests(load, 2000, 256, ImageMix(fraction=0.5, repeat_rate=0.4))
    with_images = [request for request in requests if request.images]
    assert 0.45 < len(with_images) / len(requests) < 0.55
    assert all(not request.images and request.image_repeat is None for request in requests if request not in with_images)
    assert all(request.image_pixels == 1920 * 1080 and len(request.image_digests) == 1 for request in with_images)
    repeats = sum(1 for request in with_images if request.image_repeat)
    assert 0.35 < repeats / len(with_images) < 0.45
    again = planned_requests(load, 2000, 256, ImageMix(fraction=0.5, repeat_rate=0.4))
    assert again == requests  # same seed, same workload


@pytest.mark.parametrize(
    ("mix", "message"),
    [
        (ImageMix(fraction=1.5), "--image-fraction must be between 0 and 1, got 1.5"),
        (ImageMix(repeat_rate=-0.1), "--image-repeat-rate must be between 0 and 1, got -0.1"),
        (ImageMix(repeat_rate=float("nan")), "--image-repeat-rate must be between 0 and 1, got nan"),
    ],
)
def test_bad_image_mix_is_a_one_line_user_error(mix: ImageMix, message: str) -> None:
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        mix.validate()


def test_plan_setup_refuses_zero_api_servers() -> None:
    with pytest.raises(UserError, match=r"^--api-server-count must be at least 1 \(frontend processes\), got 0$"):
        _setup(frontend=FrontendConfig(api_server_count=0))


def test_image_rate_past_the_frontend_raises_ttft_while_the_engine_queue_stays_short() -> None:
    """Full-HD images at ~43 ms each: 10/s is ρ≈0.4, 30/s is ρ≈1.3 on one API server; the GPU keeps up with both."""
    light = simulate_run(_setup(), _images(10.0)).result.summary
    heavy = simulate_run(_setup(), _images(30.0)).result.summary
    light_frontend, heavy_frontend = light.simulation["frontend"], heavy.simulation["frontend"]
    assert light_frontend["utilisation"] < 0.6 < 1.0 < heavy_frontend["utilisation"]
    assert heavy.ttft_ms.p95 > 5 * light.ttft_ms.p95
    assert heavy_frontend["mean_scheduler_queue_ms"] < 20.0  # the scheduler queue stays short
    assert heavy_frontend["mean_frontend_wait_ms"] > 10 * heavy_frontend["mean_scheduler_queue_ms"]
    assert heavy.simulation["max_num_waiting"] <= 2


def test_planner_names_the_frontend_as_the_limit() -> None:
    heavy = simulate_run(_setup(), _images(30.0)).result.summary
    verdict = frontend_verdict(heavy.simulation["frontend"])
    assert verdict.is_limit and verdict.suggested_api_server_count >= 2
    assert "the frontend (image preprocessing in the API servers), not the GPU, is the limit" in verdict.lines[1]
    assert f"Raising --api-server-count to {verdict.suggested_api_server_count}" in verdict.lines[1]
    assert "halving the image resolution" in verdict.lines[1]
    more = simulate_run(_setup(frontend=FrontendConfig(api_server_count=verdict.suggested_api_server_count)),
                        _images(30.0)).result.summary
    assert not frontend_verdict(more.simulation["frontend"]).is_limit
    assert more.ttft_ms.p95 < heavy.ttft_ms.p95 / 3


def test_a_gpu_bound_run_does_not_blame_the_frontend() -> None:
    """Tiny images, long prompts, far more load than one L4 serves: the scheduler queue, not the frontend, grows."""
    load = LoadSpec(dataset="images", input_len=2048, output_len=64, rate=40.0, num_requests=200, image_size=(64, 64))
    summary = simulate_run(_setup(gpu="l4"), load).result.summary
    verdict = frontend_verdict(summary.simulation["frontend"])
    assert not verdict.is_limit and verdict.utilisation < 0.2
    assert summary.simulation["frontend"]["mean_scheduler_queue_ms"] > 1000.0
    assert len(verdict.lines) == 1


def test_repeated_images_hit_the_cache_and_lower_ttft() -> None:
    load = _images(25.0)
    fresh = simulate_run(_setup(), load, images=ImageMix(repeat_rate=0.0)).result
    repeated = simulate_run(_setup(), load, images=ImageMix(repeat_rate=0.8)).result
    figures = repeated.summary.simulation["frontend"]
    assert 0.7 < figures["mm_cache_hits"] / figures["mm_cache_queries"] < 0.9
    assert fresh.summary.simulation["frontend"]["mm_cache_hits"] == 0
    assert repeated.summary.ttft_ms.mean < fresh.summary.ttft_ms.mean / 2
    record = next(record for record in repeated.records if record.image_repeat)
    assert record.engine_ttft_s is not None and record.engine_queue_s is not None and record.request_type == "image"


def test_search_tries_api_server_counts_and_prefers_fewer_gpus() -> None:
    """Frontend-bound on one API server: the search finds one GPU with more API servers, not a second GPU."""
    from vlmserve.plan.search import SearchSpace, run_search
    from vlmserve.spec import SLO

    space = SearchSpace(model="qwen3-vl-4b", gpus=["h100"], tps=[1], replicas=[1, 2], max_num_seqs=[256],
                        api_server_counts=[1, 2])
    load = LoadSpec(dataset="images", input_len=128, output_len=64, rate=30.0, num_requests=200, image_size=FULL_HD)
    outcome = run_search(space, load, SLO.parse("ttft_p95=500ms"), prices={}, calibration=CALIBRATION)
    assert outcome.best is not None
    assert (outcome.best.replicas, outcome.best.api_server_count) == (1, 2)
    single = next(c for c in outcome.candidates if (c.replicas, c.api_server_count) == (1, 1))
    assert single.status == "misses" and "frontend-bound" in single.reason
