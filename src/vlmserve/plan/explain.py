"""Roofline napkin math for `vlmserve plan --explain`.

Before trusting a simulation, an engineer wants the back-of-envelope: how many bytes a
decode step streams, what token rate the memory bandwidth alone allows, how fast prefill
can go on the FLOPs, and — when a measured run is at hand — what fraction of the
datasheet bandwidth the real engine reached.
"""

from __future__ import annotations

from typing import Any

from vlmserve.results.summary import RunSummary
from vlmserve.hardware.gpus import ASSUMED_FIGURES
from vlmserve.hardware.setup import PlanSetup

GB = 1e9


def napkin(setup: PlanSetup, context_tokens: int, batch: int) -> dict[str, Any]:
    """Bytes per token and bandwidth/compute-bound rates for one replica."""
    model, gpu, tp = setup.model, setup.gpu, setup.tp
    assert setup.weight_dtype is not None
    weights_one = model.step_weight_bytes(1, setup.weight_dtype)
    weights_batch = model.step_weight_bytes(batch, setup.weight_dtype, setup.efficiency.moe_expert_spread)
    kv_one = model.kv_bytes_for_context(context_tokens, setup.kv_dtype)
    bandwidth = gpu.bandwidth_bytes_s * tp
    peak_flops = gpu.peak_flops(setup.weight_dtype) * tp
    efficiency = setup.efficiency
    memory = setup.memory()
    step_bytes_batch = weights_batch + batch * kv_one
    return {
        "weights_total_gb": model.weight_bytes(setup.weight_dtype) / GB,
        "weights_per_gpu_gb": memory.weight_bytes_per_gpu / GB,
        "kv_cache_gb": memory.kv_gb_total,
        "kv_bytes_per_token": model.kv_bytes_per_token_by_kind(setup.kv_dtype),
        "kv_tokens_capacity": setup.kv_capacity_tokens(context_tokens),
        "decode_bytes_per_token_batch1": weights_one + kv_one,
        "decode_bytes_per_step_at_batch": step_bytes_batch,
        "batch": batch,
        "context_tokens": context_tokens,
        "bandwidth_bound_tok_s_batch1_peak": bandwidth / (weights_one + kv_one),
        "bandwidth_bound_tok_s_batch1_calibrated": bandwidth * efficiency.bandwidth / (weights_one + kv_one),
        "bandwidth_bound_tok_s_at_batch_peak": batch * bandwidth / step_bytes_batch,
        "prefill_flops_per_token": model.prefill_flops_per_token(context_tokens),
        "compute_bound_prefill_tok_s_peak": peak_flops / model.prefill_flops_per_token(context_tokens),
        "compute_bound_prefill_tok_s_calibrated": peak_flops * efficiency.compute / model.prefill_flops_per_token(context_tokens),
        "efficiency": {"bandwidth": efficiency.bandwidth, "compute": efficiency.compute},
        "assumed_gpu_figures": ASSUMED_FIGURES.get(gpu.key, {}),
        "model_notes": list(model.notes),
    }


def measured_efficiency(setup: PlanSetup, summary: RunSummary, context_tokens: int, batch: int) -> dict[str, float]:
    """Bandwidth fraction a measured run reached: bytes a step must stream over its measured TPOT."""
    tpot_ms = summary.tpot_ms.mean
    if not tpot_ms:
        return {}
    assert setup.weight_dtype is not None
    spread = setup.efficiency.moe_expert_spread
    step_bytes = setup.model.step_weight_bytes(batch, setup.weight_dtype, spread) + batch * setup.model.kv_bytes_for_context(
        context_tokens, setup.kv_dtype
    )
    reached = step_bytes / (tpot_ms / 1000.0)
    return {
        "measured_tpot_ms": float(tpot_ms),
        "implied_bandwidth_tb_s": reached / 1e12,
        "bandwidth_fraction_of_peak": reached / (setup.gpu.bandwidth_bytes_s * setup.tp),
    }
