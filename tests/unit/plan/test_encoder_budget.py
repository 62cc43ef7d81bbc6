"""The planner prices the vision encoder in the step that runs it, under vLLM's encoder budget."""

from __future__ import annotations

from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.simulate import simulate_run
from vlmserve.spec import LoadSpec

STEP_TIMES = Calibration(Efficiency(compute=0.22, step_overhead_s=0.0015, per_seq_overhead_s=2e-5, request_overhead_s=0.003))
"""Pinned, not the shipped calibration: the steps are counted by hand only while requests do not overlap."""
IMAGES_PER_REQUEST = 4
REQUESTS = 20


def _load(**fields: object) -> LoadSpec:
    # 0.5 requests/s: each request meets an idle engine, so its steps can be counted by hand
    return LoadSpec(
        dataset="images",
        rate=0.5,
        num_requests=REQUESTS,
        input_len=100,
        output_len=32,
        image_size=(1024, 1024),
        images_per_request=IMAGES_PER_REQUEST,
        **fields,
    )


def test_a_budget_of_one_image_spreads_a_requests_images_over_one_step_each() -> None:
    # the step count by hand needs requests that do not overlap; with these arrivals that holds on the
    # roofline's step times with these coefficients (the measured kernels, or a calibration with larger
    # CPU overheads, price steps differently, and two requests then share steps)
    setup = PlanSetup.from_names("qwen3-vl-4b", "h100", cost_model_kind="roofline", calibration=STEP_TIMES)
    one_image = setup.model.vision.tokens_for(1024, 1024) if setup.model.vision else 0
    default = simulate_run(setup, _load(), record_token_times=False)
    large = simulate_run(setup, _load(), record_token_times=False, max_num_encoder_input_tokens=1_000_000)
    tight = simulate_run(setup, _load(), record_token_times=False, max_num_encoder_input_tokens=one_image)
    steps = [sum(stats.steps for stats in output.stats) for output in (default, large, tight)]
    assert steps[0] == steps[1]  # the default budget already takes all four images in one step
    assert steps[2] - steps[0] == REQUESTS * (IMAGES_PER_REQUEST - 1)  # the prefill waits for each next image
    for output in (default, tight):
        assert sum(stats.images_encoded for stats in output.stats) == REQUESTS * IMAGES_PER_REQUEST
        assert sum(stats.image_tokens_encoded for stats in output.stats) == REQUESTS * IMAGES_PER_REQUEST * one_image
    assert tight.result.summary.figure("ttft_ms.p50") > default.result.summary.figure("ttft_ms.p50")
    assert large.result.summary.figure("ttft_ms.p50") == default.result.summary.figure("ttft_ms.p50")


def test_repeated_images_are_encoded_once_the_multimodal_cache_counts_them_as_hits() -> None:
    setup = PlanSetup.from_names("qwen3-vl-4b", "h100")
    output = simulate_run(setup, _load(image_repeat_rate=0.5), record_token_times=False)
    stats = output.stats[0]
    assert stats.mm_cache_hits > 0
    assert stats.images_encoded == stats.mm_cache_queries - stats.mm_cache_hits
