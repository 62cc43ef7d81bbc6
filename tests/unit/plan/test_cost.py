"""The roofline step cost: memory-bound decode, compute-bound prefill, TP and MoE effects."""

from __future__ import annotations

import pytest

from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.gpus import get_gpu
from vlmserve.hardware.models import load_model
from vlmserve.hardware.setup import PlanSetup
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.sched.step_cost import StepContents

EFFICIENCY = Efficiency(bandwidth=0.5, compute=0.5, step_overhead_s=0.001, per_seq_overhead_s=0.0)


def _cost(model: str, gpu: str = "h100", tp: int = 1):
    return PlanSetup.from_names(model, gpu, tp=tp, calibration=Calibration(EFFICIENCY), cost_model_kind="roofline").cost_model()


def test_decode_is_memory_bound_at_the_bandwidth_roofline() -> None:
    cost = _cost("llama-3.1-8b")
    step = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, kv_tokens_read=1000)
    parts = cost.breakdown(step)
    assert parts.bound == "memory"
    expected_bytes = cost.model.step_weight_bytes(1, "bf16") + 131072 * 1000 + 131072
    assert parts.memory_s == pytest.approx(expected_bytes / (3.35e12 * 0.5))
    assert cost.step_time_s(step) == pytest.approx(parts.memory_s + 0.001)


def test_prefill_is_compute_bound_and_scales_with_tokens() -> None:
    cost = _cost("llama-3.1-8b")
    small = cost.breakdown(StepContents(prefill_tokens=2048, prefill_seqs=1, decode_seqs=0, kv_tokens_read=2048))
    large = cost.breakdown(StepContents(prefill_tokens=8192, prefill_seqs=4, decode_seqs=0, kv_tokens_read=8192))
    assert small.bound == "compute" and large.bound == "compute"
    assert large.compute_s == pytest.approx(4 * small.compute_s, rel=0.05)
    linear = 8192 * 2 * cost.model.active_params_per_token / (989e12 * 0.5)
    assert large.compute_s > linear


def test_tensor_parallel_splits_work_and_adds_all_reduces() -> None:
    step = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=64, kv_tokens_read=64 * 1000)
    one, two = _cost("llama-3.1-8b").breakdown(step), _cost("llama-3.1-8b", tp=2).breakdown(step)
    assert two.memory_s == pytest.approx(one.memory_s / 2)
    assert one.communication_s == 0.0 and two.communication_s > 0.0
    prefill = StepContents(prefill_tokens=8192, prefill_seqs=4, decode_seqs=0, kv_tokens_read=8192)
    nvlink = _cost("llama-3.1-8b", tp=2).breakdown(prefill).communication_s
    pcie = _cost("llama-3.1-8b", gpu="l40s", tp=2).breakdown(prefill).communication_s
    assert pcie > 5 * nvlink  # 64 GB/s PCIe vs 900 GB/s NVLink


def test_moe_decode_bytes_grow_with_the_experts_a_batch_touches() -> None:
    cost = _cost("gpt-oss-120b", gpu="h200")

    def decode(batch: int) -> float:
        return cost.breakdown(StepContents(0, 0, batch, batch * 500)).memory_s

    assert decode(8) > 1.5 * decode(1)
    assert decode(256) < 1.2 * decode(128)  # all experts touched: bytes level off


def test_images_add_vision_encoder_work() -> None:
    cost = _cost("qwen3-vl-4b")
    text = StepContents(prefill_tokens=1000, prefill_seqs=1, decode_seqs=0, kv_tokens_read=1000)
    with_image = StepContents(prefill_tokens=1000, prefill_seqs=1, decode_seqs=0, kv_tokens_read=1000, image_tokens=256, images=1)
    assert cost.step_time_s(with_image) > cost.step_time_s(text)


def test_async_scheduling_hides_cpu_overhead_behind_the_gpu_step() -> None:
    efficiency = Efficiency(bandwidth=0.5, compute=0.5, step_overhead_s=0.002, per_seq_overhead_s=0.00002)

    def cost(async_scheduling: bool):
        return PlanSetup.from_names(
            "llama-3.1-8b",
            "h100",
            calibration=Calibration(efficiency),
            async_scheduling=async_scheduling,
            cost_model_kind="roofline",
        ).cost_model()

    decode = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=256, kv_tokens_read=256 * 1000)
    serial, overlapped = cost(False).breakdown(decode), cost(True).breakdown(decode)
    assert serial.overhead_s == pytest.approx(0.002 + 256 * 0.00002)
    assert cost(False).step_time_s(decode) == pytest.approx(serial.gpu_s + serial.overhead_s)
    assert cost(True).step_time_s(decode) == pytest.approx(max(overlapped.gpu_s, overlapped.overhead_s))
    # a tiny step is CPU-bound even when overlapped: the overhead is a floor, not removed
    idle = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=0, kv_tokens_read=0)
    assert cost(True).step_time_s(idle) == pytest.approx(0.002)


def test_the_api_server_bounds_a_step_only_when_it_has_more_to_do_than_the_engine() -> None:
    """vLLM's API server is its own process: a step takes the longer of the engine and the frontend."""
    from vlmserve.hardware.cost import frontend_step_s

    quiet = Efficiency(bandwidth=0.7, compute=0.5, step_overhead_s=0.001, per_seq_overhead_s=0.0)
    busy = quiet.with_values(frontend_token_s=1e-4, frontend_request_s=5e-3)
    model = load_model("llama-3.1-8b")
    small = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, kv_tokens_read=1000)
    burst = StepContents(prefill_tokens=64 * 128, prefill_seqs=64, decode_seqs=900, kv_tokens_read=900 * 130 + 64 * 128)
    for kind in ("roofline", "kernels"):

        def cost(eff: Efficiency, servers: int = 1, kind: str = kind):  # noqa: ANN202
            return PlanSetup(
                model=model,
                gpu=get_gpu("h100"),
                calibration=Calibration(eff),
                cost_model_kind=kind,
                frontend=FrontendConfig(api_server_count=servers),
            ).cost_model()

        assert cost(busy).step_time_s(small) == pytest.approx(cost(quiet).step_time_s(small))
        frontend = 1e-4 * (64 + 900) + 5e-3 * 64
        assert frontend_step_s(busy, burst) == pytest.approx(frontend)
        assert cost(busy).step_time_s(burst) == pytest.approx(frontend)
        assert cost(busy, servers=4).step_time_s(burst) == pytest.approx(max(frontend / 4, cost(quiet).step_time_s(burst)))
