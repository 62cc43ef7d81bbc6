"""Roofline napkin math for `vlmserve plan --explain`.

Before trusting a simulation, an engineer wants the back-of-envelope: how many bytes a
decode step streams, what token rate the memory bandwidth alone allows, how fast prefill
can go on the FLOPs, and — when a measured run is at hand — what fraction of the
datasheet bandwidth the real engine reached.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlmserve.hardware.gpus import ASSUMED_FIGURES
from vlmserve.hardware.setup import PlanSetup
from vlmserve.results.blocks import SimulatedFrontend
from vlmserve.results.summary import RunSummary
from vlmserve.spec import LoadSpec

GB = 1e9


def step_cost_sources(setup: PlanSetup) -> list[tuple[str, str]]:
    """(op class, where its cost comes from) for the deployment's step cost model.

    Measured kernels name the table file, GPU and vLLM version per op class (or "roofline" and
    why); the roofline model is one line with the reason it was chosen.
    """
    cost = setup.cost_model()
    sources = getattr(cost, "sources", None)
    if sources is None:
        return [("every op", setup.cost_model_summary())]
    return [(name, source.describe()) for name, source in sources().items()]


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


FRONTEND_BUSY = 0.8
"""Frontend utilization from which the API servers, not the GPU, set the pace."""


def frontend_is_limit(block: SimulatedFrontend | None) -> bool:
    """Whether a simulated run's frontend block says the API servers, not the GPU, set the pace:
    busy at least FRONTEND_BUSY, and image requests wait longer there than in the engine's queue."""
    if block is None:
        return False
    return block.utilization >= FRONTEND_BUSY and block.mean_frontend_s > block.mean_engine_queue_s


def frontend_findings(setup: PlanSetup, load: LoadSpec, summary: RunSummary) -> list[str]:
    """Whether the frontend (image preprocessing) is the limit, and what would change it (simulated).

    The frontend is named the limit when its busiest API servers are busy at least FRONTEND_BUSY
    of the run and image requests wait longer there than in the engine's queue. Then the same
    load is simulated again with one more API server per replica, and with images at half the
    side (a quarter of the pixels), and the TTFT p50 of each is given.
    """
    block = summary.simulation.frontend if summary.simulation is not None else None
    if block is None:
        return []
    utilization, waited, queued = block.utilization, block.mean_frontend_s, block.mean_engine_queue_s
    lines = [
        f"frontend (simulated): API servers {utilization:.0%} busy, image requests spend {waited * 1000:.0f} ms there "
        f"and {queued * 1000:.0f} ms in the engine's queue; multimodal cache hit rate {block.mm_cache_hit_rate:.2f}"
    ]
    if not frontend_is_limit(block):
        return lines
    from vlmserve.plan.simulate import simulate_run

    base = summary.figure("ttft_ms.p50")
    more = dataclasses.replace(
        setup, frontend=dataclasses.replace(setup.frontend, api_server_count=setup.frontend.api_server_count + 1)
    )
    smaller = load.model_copy(
        update={
            "image_size": (max(1, load.image_size[0] // 2), max(1, load.image_size[1] // 2)),
            "image_size_mix": [(max(1, w // 2), max(1, h // 2), weight) for w, h, weight in load.image_size_mix]
            if load.image_size_mix
            else None,
        }
    )
    with_servers = simulate_run(more, load, record_token_times=False).result.summary.figure("ttft_ms.p50")
    with_smaller = simulate_run(setup, smaller, record_token_times=False).result.summary.figure("ttft_ms.p50")
    lines += [
        "the limit is the frontend, not the GPU: image preprocessing in vLLM's API server(s) queues requests "
        "while the engine waits for work",
        f"  --api-server-count {more.frontend.api_server_count}: TTFT p50 {base:.0f} -> {with_servers:.0f} ms (simulated)",
        f"  images at half the side (e.g. the gateway's --image-downscale-max-side): TTFT p50 {base:.0f} -> "
        f"{with_smaller:.0f} ms (simulated)",
    ]
    return lines
