"""Ops a GPU's own tables lack are priced from a donor GPU's measurement, scaled by the two rooflines.

The A100 tables carry no MoE rows and no head-size-64 attention; before, those ops fell to the
roofline times a fitted efficiency, which priced gpt-oss's experts on an A100 nine times slower
than on an H100 (the datasheets say about three). Here the H100's measured curve is carried over:
its latency at each token count × the A100's roofline time / the H100's for the same op.
"""

from __future__ import annotations

import pytest

from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.gpus import get_gpu
from vlmserve.hardware.kernels.ops import MoePricer
from vlmserve.hardware.kernels.roofline_ops import OpRoofline
from vlmserve.hardware.kernels.step_cost import DECODE_ATTN, MOE, PREFILL_ATTN
from vlmserve.hardware.setup import PlanSetup

EFFICIENCY = Efficiency(bandwidth=0.8, compute=0.5, step_overhead_s=0.001, per_seq_overhead_s=0.00001)


def _cost(gpu: str):  # noqa: ANN202 - MeasuredStepCost (imports pyarrow)
    return PlanSetup.from_names("openai/gpt-oss-120b", gpu, calibration=Calibration(EFFICIENCY)).cost_model()


def test_a100_experts_are_the_h100_measurement_times_the_roofline_ratio() -> None:
    a100, h100 = _cost("a100"), _cost("h100")
    sources = a100.sources()
    assert "(transferred)" in sources[MOE].label and "h100" in sources[MOE].label
    assert "h100's measurement" in sources[MOE].note
    moe_a100, moe_h100 = a100._moe, h100._moe
    assert moe_a100 is not None and moe_h100 is not None
    for tokens in (16, 512, 2048, 8192):
        own = moe_a100.roofline_layer_s(tokens, OpRoofline(get_gpu("a100"), EFFICIENCY))
        donor = moe_a100.roofline_layer_s(tokens, OpRoofline(get_gpu("h100"), EFFICIENCY))
        assert moe_a100.seconds(tokens) == pytest.approx(moe_h100.seconds(tokens) * own / donor, rel=1e-9)


def test_transferred_experts_are_slower_on_the_slower_gpu_by_at_most_its_datasheet_ratio() -> None:
    a100, h100 = get_gpu("a100"), get_gpu("h100")
    bound = max(h100.bf16_tflops / a100.bf16_tflops, h100.memory_bandwidth_tb_s / a100.memory_bandwidth_tb_s)
    moe_a100, moe_h100 = _cost("a100")._moe, _cost("h100")._moe
    assert moe_a100 is not None and moe_h100 is not None
    for tokens in (1, 64, 1024, 16384):
        ratio = moe_a100.seconds(tokens) / moe_h100.seconds(tokens)
        assert 1.0 < ratio <= bound * 1.0001, (tokens, ratio)


def test_a100_attention_of_head_size_64_is_transferred_and_named() -> None:
    a100 = _cost("a100")
    sources = a100.sources()
    for op in (PREFILL_ATTN, DECODE_ATTN):
        assert "(transferred)" in sources[op].label, sources[op].describe()
    h100 = _cost("h100")
    a100_prefill, _ = a100._attention_s(4, 2048, 2048, 0, 0)
    h100_prefill, _ = h100._attention_s(4, 2048, 2048, 0, 0)
    assert a100_prefill > h100_prefill


def test_a_shape_no_gpu_measured_stays_on_the_roofline_and_says_so() -> None:
    roof = OpRoofline(get_gpu("a100"), EFFICIENCY)
    pricer = MoePricer("a100", "bf16", 1234, 567, 3, 33, 1, roof, lambda tokens, on: on.time_s(tokens * 1e9, 0.0))
    assert pricer.source.label == "roofline"
    assert pricer.seconds(100) == pytest.approx(roof.time_s(100 * 1e9, 0.0))
