"""GPU memory as vLLM V1 divides it: the KV cache is what the profiling run leaves.

vLLM V1 (`vllm/v1/worker/gpu_worker.py`, `determine_available_memory`) does, per GPU:

    requested = total_memory × gpu_memory_utilization        # total as torch reports it (GiB)
    profile_run()   # a dummy forward of max_num_batched_tokens tokens, the sampler on
                    # max_num_seqs rows of logits, and for VLMs the encoder on its budget
    kv_cache = requested − weights − torch activation peak − non-torch increase
                (NCCL / custom all-reduce buffers, cuBLAS workspaces; CUDA graphs where the
                 version profiles them)

and the KV cache holds `kv_cache ÷ bytes per token per GPU` tokens — the figure it prints as
"GPU KV cache size: N tokens", with "Maximum concurrency for L tokens per request" = N ÷ L.

This module rebuilds that arithmetic from config.json and the engine limits. Everything is in
binary units (GiB) like vLLM's own log. The activation peak is an estimate from the shapes the
profiling run allocates (largest live intermediate of one layer at max_num_batched_tokens, the
sampler's float32 logits and their sort, the encoder cache); tests/unit/plan/
test_kv_capacity_published.py holds it against KV sizes vLLM printed in published logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import normalize_kv_dtype
from vlmserve.hardware.gpus import GB, GIB, GPU
from vlmserve.hardware.models import KV_BYTES, ModelCost

ACTIVATION_BYTES = 2.0
"""Activations run in BF16."""

SAMPLER_BYTES_PER_LOGIT = 38.5
"""Peak bytes per (row × vocab entry) of vLLM's dummy sampler run, which exercises top-k/top-p on
purpose: BF16 logits, their float32 copy, the sort's float32 values and int64 indices, the masks,
softmax/cumsum and the scattered result live at once (≈ 29 bytes) plus allocator rounding. Held
against three published profiles, all of which print the activation peak: Qwen3-Next TP2 on H200,
1024 seqs × 151,936 vocab → 5.58 GiB; gpt-oss-20b on H100, 1024 × 201,088 → 7.38 GiB; Qwen3-235B
TP4 on L40S, 256 × 151,936 → 1.40 GiB (each within 1 %)."""

NON_TORCH_BYTES = 0.2 * GIB
"""Memory outside PyTorch's allocator that appears during start-up on one GPU (cuBLAS workspaces,
kernel modules): 0.13–0.21 GiB in the published profiles; the CUDA context predates vLLM's baseline."""

CUSTOM_ALLREDUCE_BYTES = 1.2 * GIB
"""Extra non-torch memory per GPU under tensor parallelism over NVLink: NCCL communicators plus
vLLM's custom all-reduce buffers (1.38 GiB in all at TP2 on H200). Over PCIe vLLM disables custom
all-reduce and the increase is negligible (0.21 GiB in all at TP4 on L40S)."""

CUDA_GRAPH_BYTES = 0.5 * GIB
"""CUDA-graph pool that vLLM ≥ 0.21 profiles and counts against the budget (0.4–0.7 GiB for dense
8–32B models at the default capture sizes; MoE models at TP4 reach 2–3.5 GiB). Older versions
capture graphs after sizing the KV cache, in the (1 − utilization) headroom."""


@dataclass(frozen=True)
class MemoryPlan:
    """How one replica's memory splits, per GPU, into weights, profiling peak and KV cache."""

    gpus: int
    """GPUs in the replica (tp, or ep when experts are spread wider)."""
    visible_bytes_per_gpu: float
    budget_bytes_per_gpu: float
    """visible × --gpu-memory-utilization: everything vLLM lets itself use."""
    weight_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    non_torch_bytes_per_gpu: float
    kv_bytes_per_gpu: float

    @property
    def reserved_bytes_per_gpu(self) -> float:
        """Budget that is neither weights nor KV cache: the profiling peak and non-torch memory."""
        return self.activation_bytes_per_gpu + self.non_torch_bytes_per_gpu

    @property
    def usable_bytes_per_gpu(self) -> float:
        return self.budget_bytes_per_gpu

    @property
    def kv_bytes_total(self) -> float:
        """KV cache bytes across the replica's GPUs."""
        return self.kv_bytes_per_gpu * self.gpus

    @property
    def kv_gb_total(self) -> float:
        """Decimal GB, as the rest of the report prints sizes."""
        return self.kv_bytes_total / GB

    @property
    def kv_gib_per_gpu(self) -> float:
        """What vLLM logs as "Available KV cache memory: X GiB"."""
        return self.kv_bytes_per_gpu / GIB


def activation_peak_bytes(
    model: ModelCost, tp: int, max_num_batched_tokens: int, max_num_seqs: int, ep: int | None = None
) -> float:
    """Torch memory the profiling run peaks at above the weights, on one GPU.

    The forward pass keeps the hidden state and residual for all T = max_num_batched_tokens
    tokens and, inside one layer, the widest intermediate: the fused QKV output, the MLP's
    gate/up output plus its activation, or the fused-MoE caches (T·k rows of 2I, I and h).
    After it, the sampler runs on min(max_num_seqs, T) rows of full-vocabulary logits. The two
    peaks do not overlap; the larger counts. A vision tower adds its encoder-output cache.
    """
    tokens = float(max_num_batched_tokens)
    hidden = model.hidden_size
    residual = 2.0 * tokens * hidden * ACTIVATION_BYTES
    widest = 0.0
    for group in model.attention:
        if group.linear is not None:
            width = group.linear.conv_dim + 2 * group.linear.value_heads * group.linear.value_head_dim
        elif group.mla is not None:
            mla = group.mla
            width = group.q_heads * (2 * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) + 2 * mla.v_head_dim)
        else:
            width = (2 * group.q_heads + 2 * group.kv_heads) * group.head_dim
        widest = max(widest, tokens * width / tp * ACTIVATION_BYTES)
    if model.dense_mlp_params:
        # dense MLPs (and shared experts) averaged over the layers that carry them
        dense_layers = max(model.num_layers - model.moe_layers, 0) or model.num_layers
        mlp_width = model.dense_mlp_params / (3 * hidden * max(dense_layers, 1))
        widest = max(widest, tokens * 3 * mlp_width / tp * ACTIVATION_BYTES)
    if model.is_moe:
        expert_width = model.expert_params / (3 * hidden)
        rows = tokens * model.experts_per_token
        # TP splits every expert's width; under EP each GPU runs whole experts (fused-MoE workspaces
        # are sized for all T·k rows either way)
        width_split = 1 if ep else tp
        widest = max(widest, rows * (3 * expert_width / width_split + hidden) * ACTIVATION_BYTES)
    forward = residual + widest
    rows = min(max_num_seqs, max_num_batched_tokens)
    sampler = rows * model.vocab_size * SAMPLER_BYTES_PER_LOGIT + tokens * hidden * ACTIVATION_BYTES
    peak = max(forward, sampler)
    if model.vision is not None:
        encoder_tokens = max(tokens, float(model.vision.default_tokens_per_image))
        peak += encoder_tokens * hidden * ACTIVATION_BYTES * (1 + model.vision.patches_per_image_token)
    return peak


def plan_memory(
    model: ModelCost,
    gpu: GPU,
    tp: int,
    *,
    weight_dtype: str,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    ep: int | None = None,
    cuda_graphs_in_budget: bool = True,
) -> MemoryPlan:
    """The KV cache left per GPU after vLLM's profiling run (see the module doc).

    `cuda_graphs_in_budget`: vLLM ≥ 0.21 counts its CUDA-graph pool in the budget; set False to
    reproduce older versions. Raises a UserError that says how many GiB are missing when the
    weights and the profiling peak do not fit.
    """
    if tp < 1:
        raise UserError("--tp must be at least 1")
    if model.attention and model.attention[0].kind != "linear" and model.attention[0].q_heads % tp != 0:
        raise UserError(
            f"{model.name} has {model.attention[0].q_heads} attention heads, which {tp} GPUs cannot split evenly; "
            "pick a TP that divides it"
        )
    if ep is not None:
        if not model.is_moe:
            raise UserError(f"--ep applies to MoE models; {model.name} has no experts")
        if ep < tp or ep % tp != 0:
            raise UserError(f"--ep {ep} must be a multiple of --tp {tp} (EP spans TP × data-parallel ranks)")
        if model.num_experts % ep != 0:
            raise UserError(f"{model.name} has {model.num_experts} experts, which --ep {ep} cannot split evenly")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise UserError("--gpu-memory-utilization must be in (0, 1]")
    gpus = ep or tp
    visible = gpu.visible_memory_bytes
    budget = visible * gpu_memory_utilization
    weights = model.weight_bytes_per_gpu(weight_dtype, tp, ep)
    activation = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs, ep)
    custom_allreduce = CUSTOM_ALLREDUCE_BYTES if gpus > 1 and "nvlink" in gpu.interconnect.lower() else 0.0
    non_torch = NON_TORCH_BYTES + custom_allreduce + (CUDA_GRAPH_BYTES if cuda_graphs_in_budget else 0.0)
    kv = budget - weights - activation - non_torch
    if kv <= 0:
        raise UserError(
            f"{model.name} ({weight_dtype}) does not fit on {gpus}× {gpu.name}: weights need {weights / GIB:.1f} GiB "
            f"per GPU and vLLM's profiling run {(activation + non_torch) / GIB:.1f} GiB more, but "
            f"{gpu_memory_utilization:.2f} × {visible / GIB:.1f} GiB allows {budget / GIB:.1f} GiB; "
            f"{-kv * gpus / GIB:.1f} GiB missing in all — raise --tp, pick a larger GPU or a smaller weight dtype"
        )
    return MemoryPlan(gpus, visible, budget, weights, activation, non_torch, kv)


def kv_capacity_tokens(
    model: ModelCost, memory: MemoryPlan, tp: int, kv_dtype: str, typical_context: int, block_size: int = 16
) -> int:
    """Tokens the replica's KV cache holds at this context length, as vLLM counts them.

    Per GPU: KV bytes ÷ bytes one token costs on that GPU (KV heads split over TP but never
    below one head; the MLA latent whole on every GPU; sliding layers capped at their window
    and linear-attention state amortised over the typical context), rounded down to whole
    blocks. Under expert parallelism each data-parallel rank (ep ÷ tp of them) has its own cache.
    """
    context = max(typical_context, 1)
    per_sequence = model.kv_bytes_for_context_per_gpu(context, kv_dtype, tp)
    bytes_per_token = per_sequence / context if per_sequence > 0 else 1.0
    blocks = int(memory.kv_bytes_per_gpu / (bytes_per_token * block_size))
    data_parallel_ranks = max(memory.gpus // tp, 1)
    return blocks * block_size * data_parallel_ranks


@dataclass(frozen=True)
class VllmStartupReport:
    """The two capacity lines vLLM prints at start-up, as this model predicts them."""

    kv_cache_tokens: int
    """"GPU KV cache size: N tokens"."""
    max_concurrency: float
    """"Maximum concurrency for max_model_len tokens per request: X"."""
    block_size: int
    """Tokens per KV block (hybrid linear-attention models enlarge it to fit one layer's state)."""


def _round_up(value: float, multiple: int) -> int:
    return int(-(-value // multiple) * multiple)


def vllm_startup_report(
    model: ModelCost, kv_bytes_per_gpu: float, tp: int, kv_dtype: str, max_model_len: int, block_size: int = 16
) -> VllmStartupReport:
    """What vLLM (V1, `kv_cache_utils`) prints for a KV cache of `kv_bytes_per_gpu` on each GPU.

    Uniform attention: blocks = memory ÷ (block × bytes per token over all layers); size = blocks ×
    block; concurrency = blocks ÷ blocks one max_model_len request needs. Hybrid linear attention
    (Qwen3-Next): the attention block grows (in multiples of 16) until one layer's page holds a
    linear layer's state; layers form groups of as many layers as there are full-attention layers,
    the groups share one block pool, the printed size is the pool's share per group, and one
    request needs its attention blocks plus one block per linear group. Sliding layers are counted
    at full length (vLLM's own sliding groups are not modelled here).
    """
    size = KV_BYTES[normalize_kv_dtype(kv_dtype)]
    full = [group for group in model.attention if group.kv_elements_per_token() and group.linear is None]
    linear = [group for group in model.attention if group.linear is not None]
    per_token_all = sum(group.kv_elements_per_token_per_gpu(tp) for group in full) * size
    if per_token_all <= 0:
        raise UserError(f"{model.name} keeps no per-token KV cache; vLLM's KV report does not apply")
    if not linear:
        blocks = int(kv_bytes_per_gpu // (per_token_all * block_size))
        needed = -(-max_model_len // block_size)
        return VllmStartupReport(blocks * block_size, blocks / needed, block_size)
    full_layers = sum(group.count for group in full)
    linear_layers = sum(group.count for group in linear)
    per_layer = per_token_all / full_layers
    state = max(group.linear.state_bytes(tp) for group in linear if group.linear is not None)
    block = max(block_size, _round_up(state / per_layer, 16))
    group_size = math.gcd(full_layers, linear_layers)
    groups = (full_layers + linear_layers) // group_size
    blocks = int(kv_bytes_per_gpu // (block * per_layer * group_size))
    needed = -(-max_model_len // block) * (full_layers // group_size) + linear_layers // group_size
    return VllmStartupReport((blocks // groups) * block, blocks / needed, block)
