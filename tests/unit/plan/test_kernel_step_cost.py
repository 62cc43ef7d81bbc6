"""MeasuredStepCost: a step priced as the vLLM kernels it runs, checked against the table rows by hand."""

from __future__ import annotations

import math
from functools import cache

import pyarrow.parquet as pq
import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.kernels.locate import locate_table
from vlmserve.hardware.kernels.quant import WEIGHT_ONLY_SLOWDOWN
from vlmserve.hardware.kernels.step_cost import DECODE_ATTN, ELEMENTWISE, LM_HEAD, MLP, PREFILL_ATTN, PROJ, MeasuredStepCost
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.explain import step_cost_sources
from vlmserve.sched.step_cost import StepContents

EFFICIENCY = Efficiency(bandwidth=0.8, compute=0.5, step_overhead_s=0.001, per_seq_overhead_s=0.00001)
LAYERS = 32


def _setup(model: str = "llama-3.1-8b", gpu: str = "h100", **options) -> PlanSetup:
    return PlanSetup.from_names(model, gpu, calibration=Calibration(EFFICIENCY), **options)


@cache
def _all_rows(gpu: str, op: str, table: str) -> list[dict]:
    ref = locate_table(gpu, op, table)
    assert ref is not None
    return pq.read_table(ref.path).to_pylist()


def _rows(gpu: str, op: str, table: str, **where) -> list[dict]:
    return [row for row in _all_rows(gpu, op, table) if all(row[key] == value for key, value in where.items())]


@cache
def _bf16_gemm_rows() -> dict[tuple[int, int, int], float]:
    """(m, n, k) → the fastest bf16 H100 row's latency in ms."""
    best: dict[tuple[int, int, int], float] = {}
    for row in _rows("h100", "gemm", "gemm_perf", gemm_dtype="bfloat16"):
        key = (row["m"], row["n"], row["k"])
        best[key] = min(best.get(key, math.inf), row["latency"])
    return best


def _gemm(m: int, n: int, k: int) -> float:
    """The bf16 H100 row at exactly (m, n, k), in seconds."""
    return _bf16_gemm_rows()[(m, n, k)] / 1000


def _between(x: float, low: float, high: float, at_low: float, at_high: float) -> float:
    """Log-log linear interpolation between two table rows, by hand."""
    weight = math.log(x / low) / math.log(high / low)
    return math.exp(math.log(at_low) + weight * (math.log(at_high) - math.log(at_low)))


def _gemm_roofline(m: float, n: float, k: float) -> float:
    flops = 2 * m * n * k / (989e12 * EFFICIENCY.compute)
    nbytes = (n * k * 2 + (m * k + m * n) * 2) / (3.35e12 * EFFICIENCY.bandwidth)
    return max(flops, nbytes)


def _neighbours(x: int, measured: set[int]) -> tuple[int, int]:
    return max(v for v in measured if v <= x), min(v for v in measured if v >= x)


def _linear_by_hand(m: int) -> tuple[float, float, float]:
    """(attention projections, MLP, LM head for m sequences) of Llama-3.1-8B on one H100, from the rows."""
    sizes = {n for (row_m, n, k) in _bf16_gemm_rows() if row_m == m and k == 4096}
    proj = LAYERS * (_gemm(m, 6144, 4096) + _gemm(m, 4096, 4096))
    # gate/up: n = 2 × 14336 = 28672 lies between two measured n (16384 and 51200 in the 0.24.0 table)
    low, high = _neighbours(28672, sizes)
    gate_up = _between(28672, low, high, _gemm(m, low, 4096), _gemm(m, high, 4096))
    # down: k = 14336 lies between the rows at k = 12288 and 16384
    low, high = _neighbours(14336, sizes)
    down = _between(14336, low, high, _gemm(m, 4096, low), _gemm(m, 4096, high))
    mlp = LAYERS * (gate_up + down)
    # LM head: n = 128256 beyond the largest measured n (65536): that row, scaled by the roofline's growth
    lm_head = _gemm(m, 65536, 4096) * _gemm_roofline(m, 128256, 4096) / _gemm_roofline(m, 65536, 4096)
    return proj, mlp, lm_head


def _attention(table: str, batch: int, **shape) -> float:
    rows = _rows(
        "h100",
        "attention",
        table,
        batch_size=batch,
        num_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        kv_cache_dtype="bfloat16",
        window_size=0,
        **shape,
    )
    assert rows
    return min(row["latency"] for row in rows) / 1000


def test_decode_step_equals_the_table_rows_summed_by_hand() -> None:
    cost = _setup().cost_model()
    assert isinstance(cost, MeasuredStepCost)
    step = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=64, kv_tokens_read=64 * 1024)
    parts = cost.breakdown(step)
    proj, mlp, lm_head = _linear_by_hand(64)
    assert parts.parts[PROJ] == pytest.approx(proj, rel=1e-9)
    assert parts.parts[MLP] == pytest.approx(mlp, rel=1e-9)
    assert parts.parts[LM_HEAD] == pytest.approx(lm_head, rel=1e-9)
    # 64 decodes over 1024 cached tokens: the generation row at step 1023 (the query's own token makes 1024)
    assert parts.parts[DECODE_ATTN] == pytest.approx(LAYERS * _attention("generation_attention_perf", 64, step=1023), rel=1e-9)
    assert parts.parts[PREFILL_ATTN] == 0.0
    elementwise = LAYERS * 64 * (8 * 4096 + 3 * 14336) * 2 / (3.35e12 * EFFICIENCY.bandwidth)
    assert parts.parts[ELEMENTWISE] == pytest.approx(elementwise, rel=1e-9)
    assert parts.overhead_s == pytest.approx(0.001 + 64 * 0.00001)
    assert cost.step_time_s(step) == pytest.approx(sum(parts.parts.values()) + parts.overhead_s, rel=1e-12)


def test_prefill_step_equals_the_table_rows_summed_by_hand() -> None:
    cost = _setup().cost_model()
    step = StepContents(prefill_tokens=2048, prefill_seqs=1, decode_seqs=0, kv_tokens_read=2048)
    parts = cost.breakdown(step).parts
    proj, mlp, _ = _linear_by_hand(2048)
    assert parts[PROJ] == pytest.approx(proj, rel=1e-9)
    assert parts[MLP] == pytest.approx(mlp, rel=1e-9)
    assert parts[LM_HEAD] == pytest.approx(_linear_by_hand(1)[2], rel=1e-9)  # one sequence samples
    assert parts[PREFILL_ATTN] == pytest.approx(LAYERS * _attention("context_attention_perf", 1, isl=2048), rel=1e-9)
    assert parts[DECODE_ATTN] == 0.0


def test_a_chunk_after_cached_context_costs_more_than_a_fresh_chunk() -> None:
    cost = _setup().cost_model()
    fresh = cost.breakdown(StepContents(512, 1, 0, 512)).parts[PREFILL_ATTN]
    late = cost.breakdown(StepContents(512, 1, 0, 8192)).parts[PREFILL_ATTN]
    assert late > 2 * fresh


def test_every_op_class_names_its_source() -> None:
    setup = _setup(tp=2)
    sources = dict(step_cost_sources(setup))
    for op_class in (PROJ, MLP, LM_HEAD, PREFILL_ATTN, DECODE_ATTN, "all-reduce (tensor parallel)"):
        assert "(h100_sxm, vLLM 0.24.0)" in sources[op_class], op_class
    assert sources["all-reduce (tensor parallel)"].startswith("comm/custom_allreduce_perf.parquet")
    assert sources[PREFILL_ATTN].startswith("attention/context_attention_perf.parquet")
    assert "16/4 heads × 128" in sources[DECODE_ATTN]  # per GPU under TP 2
    assert sources[ELEMENTWISE].startswith("roofline")
    # one GPU: the LM head's n = 128256 lies beyond the largest measured n, and the source says so once priced
    single = _setup()
    assert "scaled by the roofline" not in dict(step_cost_sources(single))[LM_HEAD]
    single.cost_model().step_time_s(StepContents(0, 0, 1, 100))
    assert "scaled by the roofline" in dict(step_cost_sources(single))[LM_HEAD]


def test_moe_and_vision_encoder_sources() -> None:
    moe = dict(step_cost_sources(_setup("gpt-oss-120b")))
    assert moe["moe: routed experts"].startswith("moe/moe_perf.parquet (h100_sxm, vLLM 0.24.0), w4a16_mxfp4")
    vlm = _setup("qwen3-vl-4b")
    sources = dict(step_cost_sources(vlm))
    assert sources["vision encoder: attention"].startswith("encoder_attention/encoder_attention_perf.parquet (h100_sxm")
    assert sources["vision encoder: GEMMs"].startswith("gemm/gemm_perf.parquet (h100_sxm")
    cost = vlm.cost_model()
    with_image = cost.breakdown(StepContents(1000, 1, 0, 1000, image_tokens=1024, images=1)).parts
    assert with_image["vision encoder: GEMMs"] > 0 and with_image["vision encoder: attention"] > 0
    assert cost.breakdown(StepContents(1000, 1, 0, 1000)).parts["vision encoder: GEMMs"] == 0.0


def test_fp8_on_a100_runs_weight_only_and_is_not_faster_than_bf16() -> None:
    bf16, fp8 = _setup(gpu="a100").cost_model(), _setup(gpu="a100", weight_dtype="fp8").cost_model()
    for step in (StepContents(0, 0, 1, 1024), StepContents(0, 0, 128, 128 * 1024), StepContents(4096, 2, 0, 4096)):
        assert fp8.step_time_s(step) >= bf16.step_time_s(step)
        assert fp8.breakdown(step).parts[MLP] == pytest.approx(WEIGHT_ONLY_SLOWDOWN * bf16.breakdown(step).parts[MLP])
    assert "weight-only" in dict(step_cost_sources(_setup(gpu="a100", weight_dtype="fp8")))[MLP]
    # on an H100 FP8 is W8A8 from the fp8 table, and faster than bf16 for a large prefill
    h100_fp8 = _setup(weight_dtype="fp8")
    assert ", fp8" in dict(step_cost_sources(h100_fp8))[MLP]
    big = StepContents(8192, 4, 0, 8192)
    assert h100_fp8.cost_model().step_time_s(big) < _setup().cost_model().step_time_s(big)


def test_int4_scales_the_measured_bf16_kernel_by_the_roofline_and_says_so() -> None:
    setup = _setup()
    bf16 = MeasuredStepCost(setup.model, setup.gpu, 1, "bf16", "bf16", EFFICIENCY)
    int4 = MeasuredStepCost(setup.model, setup.gpu, 1, "int4", "bf16", EFFICIENCY)
    assert (
        "int4 weight-only GEMM: no measured table; the bf16 kernel × the roofline's int4/bf16 ratio"
        in int4.sources()[MLP].describe()
    )
    decode, prefill = StepContents(0, 0, 1, 1024), StepContents(8192, 4, 0, 8192)
    # W4A16: a quarter of the weight bytes where decode is memory-bound, slower math where prefill is compute-bound
    assert int4.breakdown(decode).parts[MLP] < 0.5 * bf16.breakdown(decode).parts[MLP]
    assert int4.breakdown(prefill).parts[MLP] > bf16.breakdown(prefill).parts[MLP]


def test_a_weight_format_no_kernel_knows_goes_to_the_roofline_by_name() -> None:
    setup = _setup()
    odd = MeasuredStepCost(setup.model, setup.gpu, 1, "int3", "bf16", EFFICIENCY)
    source = odd.sources()[MLP]
    assert not source.measured and "weight format 'int3': no measured table" in source.describe()
    assert odd.step_time_s(StepContents(0, 0, 1, 1024)) > 0


def test_a_gpu_without_tables_uses_the_roofline_and_says_so() -> None:
    setup = _setup(gpu="l4")
    assert not setup.uses_kernels
    assert "roofline" in setup.cost_model_summary() and "L4" in setup.cost_model_summary()
    assert [source for _, source in step_cost_sources(setup)] == [setup.cost_model_summary()]
    assert not isinstance(setup.cost_model(), MeasuredStepCost)
    with pytest.raises(UserError, match="--cost-model kernels: the measured kernel tables do not cover L4"):
        _setup(gpu="l4", cost_model_kind="kernels")
    forced = _setup(cost_model_kind="roofline")
    assert not isinstance(forced.cost_model(), MeasuredStepCost) and forced.cost_model_summary().startswith("roofline")


@pytest.mark.hostile("plan --cost-model with an unknown name: one line naming the choices")
def test_unknown_cost_model_is_refused_in_one_line() -> None:
    with pytest.raises(UserError, match="--cost-model 'fast' is not known; use one of: auto, kernels, roofline"):
        _setup(cost_model_kind="fast")


def test_attention_the_tables_did_not_measure_goes_to_the_roofline_by_name() -> None:
    """A group of another kind (linear attention, MLA) or with fields the MHA/GQA rows do not model is
    priced on the roofline, and its source says why: never read from the wrong rows."""
    import dataclasses

    from vlmserve.hardware.models import AttentionLayers

    setup = _setup()
    full = setup.model.attention[0]
    linear = dataclasses.replace(full, kind="linear", count=8)  # type: ignore[arg-type]
    mixed = dataclasses.replace(setup.model, attention=(dataclasses.replace(full, count=24), linear))
    cost = MeasuredStepCost(mixed, setup.gpu, 1, "bf16", "bf16", EFFICIENCY)
    sources = cost.sources()
    assert "roofline (partly)" in sources[DECODE_ATTN].label
    assert "linear attention: no measured table for this kind" in sources[DECODE_ATTN].describe()
    step = StepContents(0, 0, 8, 8 * 1024)
    only_full = MeasuredStepCost(
        dataclasses.replace(mixed, attention=(dataclasses.replace(full, count=24),)), setup.gpu, 1, "bf16", "bf16", EFFICIENCY
    )
    assert cost.step_time_s(step) > only_full.step_time_s(step)
    assert cost.breakdown(step).parts[PREFILL_ATTN] == 0.0  # a decode-only step: the roofline part lands in decode

    @dataclasses.dataclass(frozen=True)
    class LatentLayers(AttentionLayers):
        kv_lora_rank: int = 0

    latent = LatentLayers("full", 32, 32, 32, 128, kv_lora_rank=512)
    mla = MeasuredStepCost(dataclasses.replace(setup.model, attention=(latent,)), setup.gpu, 1, "bf16", "bf16", EFFICIENCY)
    assert not mla.sources()[PREFILL_ATTN].measured
    assert "kv_lora_rank" in mla.sources()[PREFILL_ATTN].describe()


def test_all_reduce_is_vllms_custom_kernel_on_nvlink_and_nccl_on_pcie_past_two_gpus() -> None:
    assert dict(step_cost_sources(_setup(gpu="l40s", tp=2)))["all-reduce (tensor parallel)"].startswith(
        "comm/custom_allreduce_perf.parquet (l40s"
    )
    pcie = dict(step_cost_sources(_setup(gpu="l40s", tp=4)))["all-reduce (tensor parallel)"]
    assert pcie.startswith("comm/nccl_perf.parquet (l40s, NCCL ") and "custom all-reduce does not run over PCIe" in pcie
    assert dict(step_cost_sources(_setup(tp=4)))["all-reduce (tensor parallel)"].startswith(
        "comm/custom_allreduce_perf.parquet (h100_sxm"
    )


def test_fp8_experts_use_the_block_scaled_rows_of_the_published_fp8_checkpoints() -> None:
    """Qwen3-235B-A22B-FP8 (and DeepSeek's, GLM's FP8) are 128×128 block-scaled: vLLM's block-FP8 MoE prices them.

    At TP4 each GPU holds twice the expert slice of TP8 at half the bytes per weight, so FP8 TP4 experts
    cost about what BF16 TP8 experts do — not the 3–5× of the per-tensor rows at decode sizes.
    """
    import json
    from importlib.resources import files

    from vlmserve.hardware.gpus import get_gpu
    from vlmserve.hardware.models import parse_config

    path = files("aiconfigurator_core").joinpath("model_configs", "Qwen--Qwen3-235B-A22B_config.json")
    model = parse_config(json.loads(path.read_text()), name="Qwen/Qwen3-235B-A22B", source=str(path))
    fp8 = PlanSetup(model=model, gpu=get_gpu("h100"), tp=4, weight_dtype="fp8", calibration=Calibration(EFFICIENCY)).cost_model()
    bf16 = PlanSetup(model=model, gpu=get_gpu("h100"), tp=8, calibration=Calibration(EFFICIENCY)).cost_model()
    assert "fp8_block" in fp8.sources()["moe: routed experts"].label
    for tokens in (8, 64, 512):
        assert fp8._moe.seconds(tokens) < 1.5 * bf16._moe.seconds(tokens)
