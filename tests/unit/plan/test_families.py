"""One test per model family: KV bytes per token and weight bytes against config.json arithmetic
written out by hand, so that pricing a family as something else fails here; and the one-line
refusals for what the planner cannot price."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import normalize_kv_dtype
from vlmserve.hardware.gpus import WEIGHT_ONLY_COMPUTE_EFFICIENCY, get_gpu
from vlmserve.hardware.memory import plan_memory
from vlmserve.hardware.models import load_model, parse_config, preset_config
from vlmserve.hardware.setup import PlanSetup
from vlmserve.sched.step_cost import StepContents

LLAMA_8B_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
"""Llama-3.1-8B decoder linear weights: per layer q,o (4096²) + k,v (4096×1024) + gate,up,down (3×4096×14336)."""
LLAMA_8B_TABLES = 2 * 128256 * 4096
"""Input embedding plus untied LM head, kept in BF16 by every quantisation scheme."""


def _llama(**quantization_config: Any) -> dict[str, Any]:
    config = preset_config("meta-llama/Llama-3.1-8B-Instruct")
    if quantization_config:
        config["quantization_config"] = quantization_config
    return config


# ---- dense GQA -------------------------------------------------------------------------------


def test_dense_gqa_kv_and_weights() -> None:
    model = load_model("llama-3.1-8b")
    # K and V, 32 layers, 8 KV heads of 128, BF16
    assert model.kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2
    assert model.weight_bytes("bf16") == 2 * (LLAMA_8B_LINEAR + LLAMA_8B_TABLES)
    # TP8: one KV head per GPU; TP16 would replicate heads, never fewer than one per GPU
    assert model.kv_bytes_for_context_per_gpu(1, "bf16", 8) == 2 * 32 * 1 * 128 * 2
    assert model.kv_bytes_for_context_per_gpu(1, "bf16", 16) == 2 * 32 * 1 * 128 * 2


# ---- sliding window --------------------------------------------------------------------------


def test_sliding_layers_keep_only_their_window() -> None:
    config = {
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "sliding_window": 256,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    }
    model = parse_config(config, "swa")
    per_layer = 2 * 2 * 128 * 2
    assert model.kv_bytes_per_token_by_kind() == {"full": per_layer, "sliding": 3 * per_layer}
    # at 1,000 tokens of context the three sliding layers hold 256 tokens each
    assert model.kv_bytes_for_context(1000) == per_layer * 1000 + 3 * per_layer * 256
    assert model.attention_flops_per_query(1000) == 4 * 8 * 128 * (1000 + 3 * 256)


# ---- hybrid linear attention (Qwen3-Next) -----------------------------------------------------


def test_hybrid_linear_attention_keeps_state_not_per_token_kv() -> None:
    model = load_model("qwen3-next")
    # full_attention_interval 4: 12 full layers with 2 KV heads of 256; 36 Gated-DeltaNet layers add nothing per token
    assert model.kv_bytes_per_token_by_kind("bf16") == {"full": 12 * 2 * 2 * 256 * 2}
    linear = [group for group in model.attention if group.kind == "linear"]
    assert sum(group.count for group in linear) == 36
    # each linear layer keeps v_heads × d_k × d_v of recurrent state plus (kernel−1) × conv channels, BF16
    conv_channels = 2 * 16 * 128 + 32 * 128
    per_layer = (32 * 128 * 128 + 3 * conv_channels) * 2
    assert model.state_bytes_per_sequence() == 36 * per_layer
    assert model.state_bytes_per_sequence(tp=2) == 36 * per_layer / 2
    # a sequence's footprint is per-token KV on 12 layers plus the fixed state, never 48 layers of KV
    assert model.kv_bytes_for_context(1000) == 12 * 2 * 2 * 256 * 2 * 1000 + 36 * per_layer
    # the published parameter count of this architecture (79,674,391,296 from the safetensors headers)
    assert model.total_params == pytest.approx(79_674_391_296, rel=1e-4)
    # 512 experts of 3 × 2048 × 512, 10 routed per token, plus a 512-wide shared expert in each of 48 layers
    assert model.expert_params == 3 * 2048 * 512 and model.experts_per_token == 10
    assert model.dense_mlp_params == 48 * 3 * 2048 * 512


def test_linear_state_in_float32_when_the_config_says_so() -> None:
    config = preset_config("Qwen/Qwen3-Next-80B-A3B-Instruct")
    config["mamba_ssm_dtype"] = "float32"
    model = parse_config(config, "fp32-state")
    conv_channels = 2 * 16 * 128 + 32 * 128
    assert model.state_bytes_per_sequence() == 36 * (32 * 128 * 128 * 4 + 3 * conv_channels * 2)


# ---- MLA (DeepSeek-V3) -----------------------------------------------------------------------


def test_mla_caches_one_latent_per_token_per_layer() -> None:
    model = load_model("deepseek-v3")
    # kv_lora_rank 512 + qk_rope_head_dim 64, 61 layers — not 2 × 128 heads × 192
    assert model.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2
    assert model.kv_bytes_per_token("fp8") == 61 * (512 + 64)
    assert model.kv_bytes_per_token("bf16") * 25 < 2 * 61 * 128 * 192 * 2
    # the latent is not split by heads: every TP rank keeps all of it
    assert model.kv_bytes_for_context_per_gpu(1, "bf16", 8) == 61 * 576 * 2
    # attention projections by hand: q down/up (LoRA 1536), kv down (512 + 64), kv up, output
    per_layer = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * (128 + 128) + 128 * 128 * 7168
    assert model.attention_params == 61 * per_layer
    assert model.total_params / 1e9 == pytest.approx(671.0, rel=0.002)
    # prefill attends over decompressed (192 + 128)-wide heads, decode over the 2 × 512 + 64 latent
    assert model.attention_flops_per_query(1000, "prefill") == 2 * 61 * 128 * (192 + 128) * 1000
    assert model.attention_flops_per_query(1000, "decode") == 2 * 61 * 128 * (2 * 512 + 64) * 1000


# ---- MoE with expert parallelism ---------------------------------------------------------------


def test_moe_weights_per_gpu_under_expert_parallelism() -> None:
    model = load_model("deepseek-v3")
    experts = 58 * 256 * 3 * 7168 * 2048  # 58 MoE layers (3 dense first), 256 routed experts, FP8: 1 byte each
    assert model.expert_weight_bytes("fp8") == experts
    total = model.weight_bytes("fp8")
    # TP8 alone: everything split eight ways; TP2 × EP8: attention/dense split by 2, experts by 8
    assert model.weight_bytes_per_gpu("fp8", tp=8) == pytest.approx(total / 8)
    assert model.weight_bytes_per_gpu("fp8", tp=2, ep=8) == pytest.approx((total - experts) / 2 + experts / 8)
    memory = plan_memory(model, get_gpu("b200"), 2, weight_dtype="fp8", gpu_memory_utilization=0.9, ep=8)
    assert memory.gpus == 8
    assert memory.weight_bytes_per_gpu == pytest.approx((total - experts) / 2 + experts / 8)


@pytest.mark.parametrize(
    ("model", "tp", "ep", "message"),
    [
        ("deepseek-v3", 4, 12, "has 256 experts, which --ep 12 cannot split evenly"),
        ("deepseek-v3", 4, 6, "--ep 6 must be a multiple of --tp 4"),
        ("llama-3.1-8b", 1, 2, "--ep applies to MoE models; meta-llama/Llama-3.1-8B-Instruct has no experts"),
    ],
)
def test_expert_parallelism_refusals(model: str, tp: int, ep: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        plan_memory(load_model(model), get_gpu("h200"), tp, weight_dtype="bf16", gpu_memory_utilization=0.9, ep=ep)


# ---- quantisation ----------------------------------------------------------------------------


def test_fp8_is_w8a8_with_fp8_tensor_cores_and_weight_only_without() -> None:
    model = parse_config(_llama(quant_method="fp8"), "llama-fp8")
    assert model.default_weight_dtype == "fp8"
    assert model.weight_bytes() == 1 * LLAMA_8B_LINEAR + 2 * LLAMA_8B_TABLES
    h100, a100 = get_gpu("h100"), get_gpu("a100")
    assert h100.compute_path("fp8").kind == "w8a8-fp8" and h100.peak_flops("fp8") == 1979e12
    # A100 has no FP8 tensor cores: vLLM runs FP8 weight-only, which must never price faster than BF16
    assert a100.compute_path("fp8").kind == "weight-only"
    assert a100.peak_flops("fp8") == 312e12 * WEIGHT_ONLY_COMPUTE_EFFICIENCY < a100.peak_flops("bf16")
    # and a compute-bound prefill step of FP8 weights on A100 takes longer than the BF16 one
    prefill = StepContents(prefill_tokens=8192, prefill_seqs=4, decode_seqs=0, kv_tokens_read=16384)
    step = {
        dtype: PlanSetup.from_names("llama-3.1-8b", "a100", weight_dtype=dtype).cost_model().step_time_s(prefill)
        for dtype in ("bf16", "fp8")
    }
    assert step["fp8"] > step["bf16"]


def test_int4_awq_and_gptq_with_their_group_scales() -> None:
    awq = load_model("llama-3.1-8b-awq")  # group 128, zero points
    assert awq.default_weight_dtype == "int4"
    assert awq.weight_bytes() == pytest.approx(LLAMA_8B_LINEAR * (0.5 + 2 / 128 + 0.5 / 128) + 2 * LLAMA_8B_TABLES)
    gptq = parse_config(_llama(quant_method="gptq", bits=4, group_size=64, sym=True), "llama-gptq64")
    assert gptq.weight_bytes() == pytest.approx(LLAMA_8B_LINEAR * (0.5 + 2 / 64) + 2 * LLAMA_8B_TABLES)
    # W4A16 everywhere: weight-only GEMMs, below BF16 peak
    assert get_gpu("h100").compute_path("int4").kind == "weight-only"
    assert get_gpu("h100").peak_flops("int4") < get_gpu("h100").peak_flops("bf16")


@pytest.mark.parametrize(
    "quantization_config",
    [
        {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
        {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
        },
    ],
)
def test_nvfp4_is_w4a4_on_blackwell_and_weight_only_elsewhere(quantization_config: dict[str, Any]) -> None:
    model = parse_config(_llama(**quantization_config), "llama-nvfp4")
    assert model.default_weight_dtype == "nvfp4"
    # half a byte plus one FP8 scale per 16 weights
    assert model.weight_bytes() == pytest.approx(LLAMA_8B_LINEAR * (0.5 + 1 / 16) + 2 * LLAMA_8B_TABLES)
    b200, h100 = get_gpu("b200"), get_gpu("h100")
    assert b200.compute_path("nvfp4").kind == "w4a4-nvfp4" and b200.peak_flops("nvfp4") == 9000e12
    path = h100.compute_path("nvfp4")
    assert path.kind == "weight-only" and "no FP4 tensor cores" in path.note
    assert h100.peak_flops("nvfp4") < h100.peak_flops("bf16")


def test_mxfp4_quantizes_experts_only() -> None:
    model = load_model("gpt-oss-120b")
    assert model.default_weight_dtype == "mxfp4"
    bf16_tables = model.router_params + model.embedding_params + model.lm_head_params
    expected = 2 * model.attention_params + 4.25 / 8 * (model.dense_mlp_params + model.all_expert_params) + 2 * bf16_tables
    assert model.weight_bytes() == pytest.approx(expected)
    assert get_gpu("h100").peak_flops("mxfp4") == 989e12  # as calibrated: BF16 math on dequantized experts


# ---- refusals: one line naming what is missing -------------------------------------------------


@pytest.mark.parametrize(
    ("quantization_config", "message"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes' is not understood"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits is 3 for 'gptq'; only 4 and 8 are priced"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "modelopt quant_algo 'W4A8_AWQ' is not understood"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {"weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int"}}
                },
            },
            "compressed-tensors int8 W8A8",
        ),
    ],
)
def test_unknown_quantisation_is_refused_in_one_line(quantization_config: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        parse_config(_llama(**quantization_config), "q")
    assert "\n" not in caught.value.message


def test_unpriceable_layers_are_refused_not_priced_as_attention() -> None:
    config = _llama()
    config["layer_types"] = ["mamba"] * 4 + ["attention"] * 28
    with pytest.raises(UserError, match="layer type 'mamba' in 'layer_types' cannot be priced"):
        parse_config(config, "hybrid")
    config = _llama()
    config["hybrid_override_pattern"] = "M-M-M*"
    with pytest.raises(UserError, match="'hybrid_override_pattern' declares Mamba/state-space layers"):
        parse_config(config, "nemotron-h")


@pytest.mark.parametrize(
    ("preset", "field"),
    [("deepseek-ai/DeepSeek-V3", "qk_rope_head_dim"), ("Qwen/Qwen3-Next-80B-A3B-Instruct", "linear_num_value_heads")],
)
def test_new_families_name_a_missing_field(preset: str, field: str) -> None:
    config = copy.deepcopy(preset_config(preset))
    del config[field]
    with pytest.raises(UserError, match=rf"config.json has no '{field}' field"):
        parse_config(config, preset)


def test_four_bit_formats_are_weight_formats_not_kv_formats() -> None:
    with pytest.raises(UserError, match="KV cache dtype 'nvfp4' is not known; use one of: bf16, fp16, fp8"):
        normalize_kv_dtype("nvfp4")
    with pytest.raises(UserError, match="weight dtype 'int3' is not known"):
        load_model("llama-3.1-8b").weight_bytes("int3")
