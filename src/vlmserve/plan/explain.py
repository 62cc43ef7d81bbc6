"""Roofline napkin math for `vlmserve plan --explain`.

Before trusting a simulation, an engineer wants the back-of-envelope: how many bytes a
decode step streams, what token rate the memory bandwidth alone allows, how fast prefill
can go on the FLOPs, and — when a measured run is at hand — what fraction of the
datasheet bandwidth the real engine reached — and, for image workloads, whether the
frontend (image preprocessing in vLLM's API servers) rather than the GPU is the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from vlmserve.results.summary import RunSummary
from vlmserve.hardware.gpus import ASSUMED_FIGURES
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.workload import ImageMix
from vlmserve.spec import SLO, LoadSpec

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


FRONTEND_LIMIT = 0.8
"""API-server utilisation from which the frontend counts as the limit (an M/G/N queue's wait
grows steeply past it)."""
WHAT_IF_UTILISATION = 0.7
"""The utilisation a suggested --api-server-count aims for."""


@dataclass(frozen=True)
class FrontendVerdict:
    """Whether the API servers (image preprocessing), not the GPU, limit this run, and why."""

    utilisation: float
    api_server_count: int
    is_limit: bool
    suggested_api_server_count: int
    lines: list[str]


def frontend_verdict(figures: dict[str, Any]) -> FrontendVerdict:
    """Judge a simulated run's frontend block (`summary.simulation["frontend"]`).

    The frontend is the limit when its utilisation (image request rate × preprocessing per
    image request / API servers) reaches FRONTEND_LIMIT while requests wait longer for an API
    server than in the engine's scheduler queue: more GPUs would not help, more API servers
    or smaller images would.
    """
    rho = float(figures.get("utilisation", 0.0))
    servers = int(figures.get("api_server_count", 1))
    wait_ms = float(figures.get("mean_frontend_wait_ms", 0.0))
    queue_ms = float(figures.get("mean_scheduler_queue_ms", 0.0))
    per_request_ms = float(figures.get("mean_preprocess_ms_per_image_request", 0.0))
    suggested = max(servers + 1, math.ceil(rho * servers / WHAT_IF_UTILISATION)) if rho > 0 else servers
    is_limit = rho >= FRONTEND_LIMIT and wait_ms > queue_ms
    lines = [
        f"frontend: {servers} API server(s) per replica at {rho:.0%} utilisation "
        f"({float(figures.get('image_request_rate', 0.0)):.1f} image requests/s × {per_request_ms:.1f} ms preprocessing); "
        f"requests wait {wait_ms:.1f} ms for an API server on average vs {queue_ms:.1f} ms in the scheduler queue; "
        f"mm cache {int(figures.get('mm_cache_hits', 0))}/{int(figures.get('mm_cache_queries', 0))} hits"
    ]
    if is_limit:
        lines.append(
            "the frontend (image preprocessing in the API servers), not the GPU, is the limit: TTFT grows in front of "
            f"the scheduler. Raising --api-server-count to {suggested} brings utilisation to about "
            f"{rho * servers / suggested:.0%}; halving the image resolution (a quarter of the pixels) cuts the per-megapixel "
            "part of preprocessing by 4×; more repeated images (mm cache hits) skip it altogether"
        )
    return FrontendVerdict(rho, servers, is_limit, suggested, lines)


def frontend_what_ifs(setup: PlanSetup, load: LoadSpec, images: ImageMix | None, slo: SLO | None,
                      suggested_api_server_count: int) -> list[tuple[str, RunSummary]]:
    """Re-simulate the run with more API servers, and with half the image resolution (simulated figures)."""
    from vlmserve.plan.simulate import simulate_run

    more = replace(setup, frontend=replace(setup.frontend, api_server_count=suggested_api_server_count))
    width, height = load.image_size
    smaller = load.model_copy(update={"image_size": (max(width // 2, 1), max(height // 2, 1))})
    return [
        (f"--api-server-count {suggested_api_server_count}", simulate_run(more, load, slo=slo, images=images).result.summary),
        (f"images {smaller.image_size[0]}x{smaller.image_size[1]}", simulate_run(setup, smaller, slo=slo, images=images).result.summary),
    ]
