"""The planner models the image path: per-model image tokens, the frontend as a possible limit, the cache."""

from __future__ import annotations

import dataclasses

from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.explain import frontend_findings
from vlmserve.plan.simulate import simulate_run
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.spec import LoadSpec


def image_load(rate: float, **fields: object) -> LoadSpec:
    return LoadSpec(
        dataset="images", rate=rate, num_requests=300, input_len=100, output_len=50, image_size=(2048, 2048), **fields
    )


def test_image_tokens_follow_the_models_own_rule() -> None:
    setup = PlanSetup.from_names("qwen3-vl-4b", "h100")
    assert setup.model.vision is not None and setup.model.vision.estimator is not None
    small, large = setup.model.vision.tokens_for(448, 448), setup.model.vision.tokens_for(2048, 2048)
    assert small < large  # pixel-based family: more pixels, more tokens (up to max_pixels)


def test_the_planner_names_the_frontend_when_image_preprocessing_is_the_limit() -> None:
    # costs pinned (not the shipped priors, which move when they are refitted): ~95 ms per 4 MP image,
    # so 12 image requests/s overload one API server by ~15 %
    setup = PlanSetup.from_names("qwen3-vl-4b", "h100", frontend=FrontendConfig(per_image_ms=15.0, per_megapixel_ms=20.0))
    busy = simulate_run(setup, image_load(12.0), record_token_times=False).result.summary
    lines = frontend_findings(setup, image_load(12.0), busy)
    assert any("the limit is the frontend, not the GPU" in line for line in lines), lines
    assert any("--api-server-count 2" in line for line in lines) and any("half the side" in line for line in lines)
    assert busy.simulation is not None and busy.simulation.frontend is not None
    block = busy.simulation.frontend
    assert block.mean_frontend_s > 10 * block.mean_engine_queue_s  # the engine's queue stays short
    quiet = simulate_run(setup, image_load(2.0), record_token_times=False).result.summary
    assert not any("the limit is the frontend" in line for line in frontend_findings(setup, image_load(2.0), quiet))
    # more API servers relieve it
    more = dataclasses.replace(setup, frontend=dataclasses.replace(setup.frontend, api_server_count=4))
    relieved = simulate_run(more, image_load(12.0), record_token_times=False).result.summary
    assert relieved.figure("ttft_ms.p50") < busy.figure("ttft_ms.p50") / 2


def test_the_simulated_cache_hit_rate_matches_the_stated_repeat_rate() -> None:
    setup = PlanSetup.from_names("qwen3-vl-4b", "h100")
    for rate in (0.0, 0.3, 0.6):
        summary = simulate_run(setup, image_load(2.0, image_repeat_rate=rate), record_token_times=False).result.summary
        assert abs(summary.simulation.frontend.mm_cache_hit_rate - rate) < 0.1


def test_a_repeat_is_faster_by_its_preprocessing_and_encoding() -> None:
    setup = PlanSetup.from_names("qwen3-vl-4b", "h100")
    no_repeats = simulate_run(setup, image_load(1.0), record_token_times=False).result
    all_repeats = simulate_run(setup, image_load(1.0, image_repeat_rate=1.0), record_token_times=False).result
    fresh_ttft = no_repeats.summary.figure("ttft_ms.p50")
    repeat_ttft = all_repeats.summary.figure("ttft_ms.p50")
    preprocess_ms = setup.frontend.image_s(2048 * 2048) * 1000
    assert fresh_ttft - repeat_ttft > 0.9 * preprocess_ms  # at least the preprocessing, plus the encoder


def test_frontend_settings_are_checked() -> None:
    import pytest

    from vlmserve.errors import UserError

    with pytest.raises(UserError, match="--api-server-count must be at least 1"):
        PlanSetup.from_names("qwen3-vl-4b", "h100", frontend=FrontendConfig(api_server_count=0))
