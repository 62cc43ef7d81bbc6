"""Memory as vLLM V1 divides it: binary units, utilization of the visible total, the profiling peak."""

from __future__ import annotations

import pytest

from vlmserve.hardware.gpus import GIB, get_gpu
from vlmserve.hardware.memory import (
    CUDA_GRAPH_BYTES,
    CUSTOM_ALLREDUCE_BYTES,
    NON_TORCH_BYTES,
    SAMPLER_BYTES_PER_LOGIT,
    activation_peak_bytes,
    plan_memory,
)
from vlmserve.hardware.models import load_model
from vlmserve.hardware.setup import PlanSetup, vllm_default_limits


def test_an_80_gb_h100_is_80_gib_of_which_vllm_sees_79_18() -> None:
    h100 = get_gpu("h100")
    assert h100.memory_bytes == 80 * 2**30
    assert h100.visible_memory_bytes == pytest.approx(79.18 * 2**30)
    model = load_model("llama-3.1-8b")
    memory = plan_memory(
        model, h100, 1, weight_dtype="bf16", gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=256
    )
    # vLLM's budget is total × utilization, not free memory and not decimal GB
    assert memory.budget_bytes_per_gpu == pytest.approx(0.9 * 79.18 * GIB)
    assert memory.kv_bytes_per_gpu == pytest.approx(
        memory.budget_bytes_per_gpu
        - model.weight_bytes("bf16")
        - memory.activation_bytes_per_gpu
        - NON_TORCH_BYTES
        - CUDA_GRAPH_BYTES
    )


def test_the_sampler_peak_scales_with_max_num_seqs_times_vocab() -> None:
    model = load_model("qwen3-8b")
    small = activation_peak_bytes(model, 1, 2048, 8)
    big = activation_peak_bytes(model, 1, 2048, 1024)
    # 1,024 rows of 151,936 float32 logits sorted with int64 indices
    assert big == pytest.approx(1024 * 151936 * SAMPLER_BYTES_PER_LOGIT + 2048 * 4096 * 2)
    assert big > 10 * small


def test_the_forward_peak_scales_with_max_num_batched_tokens() -> None:
    model = load_model("qwen3-8b")
    # with few sequences the forward pass dominates: hidden + residual, plus the MLP's gate/up and activation
    expected = 2 * 16384 * 4096 * 2 + 16384 * 3 * 12288 * 2
    assert activation_peak_bytes(model, 1, 16384, 4) == pytest.approx(expected)
    assert activation_peak_bytes(model, 2, 16384, 4) < expected  # TP splits the MLP width


def test_custom_allreduce_buffers_only_over_nvlink() -> None:
    model = load_model("qwen3-32b")
    h100 = plan_memory(model, get_gpu("h100"), 2, weight_dtype="bf16", gpu_memory_utilization=0.9)
    l40s = plan_memory(model, get_gpu("l40s"), 2, weight_dtype="bf16", gpu_memory_utilization=0.9)
    assert h100.non_torch_bytes_per_gpu - l40s.non_torch_bytes_per_gpu == pytest.approx(CUSTOM_ALLREDUCE_BYTES)


def test_older_vllm_keeps_cuda_graphs_out_of_the_budget() -> None:
    model = load_model("qwen3-8b")
    new = plan_memory(model, get_gpu("l40s"), 1, weight_dtype="bf16", gpu_memory_utilization=0.9)
    old = plan_memory(model, get_gpu("l40s"), 1, weight_dtype="bf16", gpu_memory_utilization=0.9, cuda_graphs_in_budget=False)
    assert old.kv_bytes_per_gpu - new.kv_bytes_per_gpu == pytest.approx(CUDA_GRAPH_BYTES)


def test_setup_uses_the_engine_limits_and_counts_mla_latent_per_gpu() -> None:
    setup = PlanSetup.from_names("deepseek-v3", "h200", tp=8)
    memory = setup.memory()
    # vLLM's defaults on a ≥ 70 GiB GPU drive the profiling peak
    assert (setup.max_num_seqs, setup.max_num_batched_tokens) == vllm_default_limits(get_gpu("h200")) == (1024, 8192)
    # every GPU keeps the whole 576-wide latent for all 61 layers: capacity is per-GPU memory over 70,272 bytes
    assert setup.kv_capacity_tokens(4096) == int(memory.kv_bytes_per_gpu / (61 * 576 * 2 * 16)) * 16


def test_expert_parallel_ranks_each_hold_a_cache() -> None:
    setup = PlanSetup.from_names("deepseek-v3", "b200", tp=2, ep=8)
    assert setup.num_gpus == 8
    memory = setup.memory()
    per_rank = int(memory.kv_bytes_per_gpu / (61 * 576 * 2 * 16)) * 16
    assert setup.kv_capacity_tokens(4096) == 4 * per_rank  # four data-parallel ranks of TP2
