"""Hugging Face `config.json` → the cost terms the roofline model prices.

The planner never loads weights: everything it needs (bytes to stream per step, FLOPs per
token, KV bytes per token per layer kind, vision-encoder work per image token) follows from
the architecture fields of `config.json`. This module reads those fields for dense, GQA,
MLA (DeepSeek-V2/V3: one compressed latent per token per layer), MoE (routed + shared experts),
sliding/global attention mixes, hybrid linear-attention layers (Qwen3-Next: a fixed recurrent
state per sequence, no per-token KV), cross-layer KV sharing, a vision tower and the checkpoint's
quantisation (fp8, AWQ/GPTQ int4/int8, NVFP4, MXFP4), and ships presets for the models in the
project's reference table. Whatever it cannot price — an unknown layer type or quantisation
method, a bit width other than 4 or 8 — is refused in one line naming what is missing: nothing is
silently priced as something else.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal, TypedDict

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import normalize_dtype, normalize_kv_dtype, weight_bytes_per_param
from vlmserve.hardware.jsonfile import read_json_file
from vlmserve.hardware.quantization import QuantScheme, parse_quantization
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.vision.tokens import ImageTokenEstimator, SoftTokenBudget, estimator_from_configs

AttentionKind = Literal["full", "sliding", "mla", "linear"]

PRESET_PACKAGE = "vlmserve.hardware.presets"

KV_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
"""Bytes per KV-cache element by `--kv-cache-dtype`."""

STATE_BYTES = 2.0
"""Bytes per linear-attention state element: vLLM keeps the recurrent state in the model dtype."""


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2/V3): K and V live in one compressed latent.

    The cache keeps, per token per layer, the `kv_lora_rank` latent plus the shared
    `qk_rope_head_dim` rotary key — not 2 × heads × head_dim.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None


@dataclass(frozen=True)
class LinearAttentionShape:
    """A linear-attention layer (Qwen3-Next / Qwen3.5 Gated DeltaNet): fixed state, no per-token KV."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    recurrent_bytes: float = 2.0
    """Bytes per recurrent-state element: the model dtype, or 4 where config.json sets mamba_ssm_dtype float32."""

    @property
    def conv_dim(self) -> int:
        """Channels of the short causal convolution over q, k and v."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def state_elements(self) -> int:
        """Recurrent state (v_heads × d_k × d_v) plus the convolution's last (kernel − 1) inputs."""
        recurrent = self.value_heads * self.key_head_dim * self.value_head_dim
        return recurrent + (self.conv_kernel - 1) * self.conv_dim

    def state_bytes(self, tp: int = 1) -> float:
        """Bytes one sequence's state takes in one layer on each of `tp` GPUs (heads and channels split)."""
        recurrent = self.value_heads * self.key_head_dim * self.value_head_dim / tp
        conv = (self.conv_kernel - 1) * self.conv_dim / tp
        return recurrent * self.recurrent_bytes + conv * STATE_BYTES


@dataclass(frozen=True)
class AttentionLayers:
    """A group of decoder layers with the same attention shape."""

    kind: AttentionKind
    count: int
    q_heads: int
    kv_heads: int
    head_dim: int
    window: int | None = None
    """Sliding window in tokens (sliding layers only): KV beyond it is neither kept nor read."""
    owns_kv: bool = True
    """False for layers that reuse another layer's KV (no cache of their own, no K/V projections)."""
    k_eq_v: bool = False
    """Keys double as values (no V projection); the cache still holds both after preparation."""
    mla: MlaShape | None = None
    """The latent shape of MLA layers (kind 'mla')."""
    linear: LinearAttentionShape | None = None
    """The state shape of linear-attention layers (kind 'linear')."""
    output_gate: bool = False
    """A sigmoid gate on the attention output doubles the query projection (Qwen3-Next, Qwen3.5)."""

    def params(self, hidden_size: int) -> int:
        """Projection weights of all layers in the group."""
        if self.mla is not None:
            mla = self.mla
            qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            if mla.q_lora_rank:
                q_proj = hidden_size * mla.q_lora_rank + mla.q_lora_rank * self.q_heads * qk_dim
            else:
                q_proj = hidden_size * self.q_heads * qk_dim
            kv_down = hidden_size * (mla.kv_lora_rank + mla.qk_rope_head_dim)
            kv_up = mla.kv_lora_rank * self.q_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
            out = self.q_heads * mla.v_head_dim * hidden_size
            return self.count * (q_proj + kv_down + kv_up + out)
        if self.linear is not None:
            lin = self.linear
            qkvz = hidden_size * (2 * lin.key_heads * lin.key_head_dim + 2 * lin.value_heads * lin.value_head_dim)
            gates = hidden_size * 2 * lin.value_heads
            conv = lin.conv_dim * lin.conv_kernel
            out = lin.value_heads * lin.value_head_dim * hidden_size
            return self.count * (qkvz + gates + conv + out)
        q_and_o = (3 if self.output_gate else 2) * hidden_size * self.q_heads * self.head_dim
        kv_projections = 0 if not self.owns_kv else (1 if self.k_eq_v else 2)
        k_and_v = kv_projections * hidden_size * self.kv_heads * self.head_dim
        return self.count * (q_and_o + k_and_v)

    def kv_elements_per_token(self) -> int:
        """Cache elements one token adds to this group (0 when shared or linear).

        GQA: K and V for every KV head. MLA: one latent of kv_lora_rank + qk_rope_head_dim,
        whatever the head count.
        """
        if not self.owns_kv or self.linear is not None:
            return 0
        if self.mla is not None:
            return self.count * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
        return 2 * self.count * self.kv_heads * self.head_dim

    def kv_elements_per_token_per_gpu(self, tp: int) -> float:
        """Cache elements one token adds on each of `tp` GPUs.

        KV heads split across GPUs, but never below one head each (vLLM replicates them when
        tp > kv_heads); the MLA latent is not per head, so every GPU keeps all of it.
        """
        if not self.owns_kv or self.linear is not None:
            return 0.0
        if self.mla is not None:
            return float(self.kv_elements_per_token())
        heads_per_gpu = max(self.kv_heads / tp, 1.0) if self.kv_heads else 0.0
        return 2.0 * self.count * heads_per_gpu * self.head_dim

    def state_bytes_per_sequence(self, tp: int = 1) -> float:
        """Fixed per-sequence state bytes (linear-attention layers) on each of `tp` GPUs, whatever the context."""
        return self.count * self.linear.state_bytes(tp) if self.linear is not None else 0.0

    def context_seen(self, context_tokens: float) -> float:
        """Tokens one query attends to (capped at the window for sliding layers; none for linear)."""
        if self.linear is not None:
            return 0.0
        if self.window is not None:
            return min(context_tokens, float(self.window))
        return context_tokens

    def flops_per_key(self, phase: str = "prefill") -> float:
        """QKᵀ + PV FLOPs for one query against one cached key, over the group's layers.

        MLA runs two ways in vLLM: prefill decompresses K/V and runs ordinary attention over
        (nope + rope)-wide keys and v_head_dim-wide values; decode absorbs the up-projections
        and attends over the latent itself (kv_lora_rank + rope for QKᵀ, kv_lora_rank for PV).
        """
        if self.linear is not None:
            return 0.0
        if self.mla is not None:
            mla = self.mla
            if phase == "decode":
                width = 2 * mla.kv_lora_rank + mla.qk_rope_head_dim
            else:
                width = mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim
            return 2.0 * self.count * self.q_heads * width
        return 4.0 * self.count * self.q_heads * self.head_dim

    def fixed_flops_per_token(self) -> float:
        """Context-independent mixing FLOPs per token (the linear layers' state update and readout)."""
        if self.linear is None:
            return 0.0
        lin = self.linear
        return 4.0 * self.count * lin.value_heads * lin.key_head_dim * lin.value_head_dim


@dataclass(frozen=True)
class VisionTower:
    """The image encoder and projector, priced per image token the LM sees."""

    params: int
    patches_per_image_token: int
    """Encoder patches that are merged/pooled into one LM token."""
    default_tokens_per_image: int
    estimator: ImageTokenEstimator | None = None
    """The model family's own token rule (vision.tokens); None: `default_tokens_per_image` for every image."""

    def tokens_for(self, width: int, height: int) -> int:
        """LM tokens one image of this size costs."""
        if self.estimator is None:
            return self.default_tokens_per_image
        return self.estimator.tokens(width, height)

    @property
    def flops_per_image_token(self) -> float:
        """2·params per patch, times the patches behind each LM token."""
        return 2.0 * self.params * self.patches_per_image_token


@dataclass(frozen=True)
class ModelCost:
    """Everything the roofline model needs to know about one model."""

    name: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    attention: tuple[AttentionLayers, ...]
    dense_mlp_params: int
    """Always-active MLP weights over all layers (dense MLPs and shared experts)."""
    expert_params: int
    """One routed expert in one MoE layer."""
    moe_layers: int
    num_experts: int
    experts_per_token: int
    router_params: int
    embedding_params: int
    """Input embedding table (looked up, not streamed, per step)."""
    tied_embeddings: bool
    lookup_only_params: int = 0
    """Other tables only indexed per token (e.g. Gemma per-layer input embeddings)."""
    vision: VisionTower | None = None
    default_weight_dtype: str = "bf16"
    max_position_embeddings: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    quant: QuantScheme | None = None
    """The checkpoint's own quantisation (group size, which layers); None for a BF16 checkpoint."""

    # ---- parameters -------------------------------------------------------------------
    @property
    def attention_params(self) -> int:
        return sum(group.params(self.hidden_size) for group in self.attention)

    @property
    def lm_head_params(self) -> int:
        """The output projection: streamed every step whether or not it is tied."""
        return self.vocab_size * self.hidden_size

    @property
    def all_expert_params(self) -> int:
        return self.expert_params * self.num_experts * self.moe_layers

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def total_params(self) -> int:
        """Every weight held in GPU memory."""
        untied_head = 0 if self.tied_embeddings else self.lm_head_params
        vision = self.vision.params if self.vision else 0
        return (
            self.attention_params
            + self.dense_mlp_params
            + self.all_expert_params
            + self.router_params
            + self.embedding_params
            + untied_head
            + self.lookup_only_params
            + vision
        )

    @property
    def active_params_per_token(self) -> int:
        """Weights one token multiplies through in the decoder (without the LM head)."""
        routed = self.experts_per_token * self.expert_params * self.moe_layers
        return self.attention_params + self.dense_mlp_params + self.router_params + routed

    # ---- bytes ------------------------------------------------------------------------
    def _bytes_per_param(self, weight_dtype: str) -> tuple[float, float]:
        """(attention projections, MLP/expert) bytes per weight for a weight format.

        FP8, int4/int8 (AWQ/GPTQ) and NVFP4 checkpoints quantize every decoder linear layer;
        MXFP4 checkpoints (gpt-oss) quantize the MLP/expert weights only. Embeddings, LM head,
        router and vision tower stay BF16 in all of them. The checkpoint's own group size and
        zero points count when the format asked for is the checkpoint's.
        """
        dtype = normalize_dtype(weight_dtype, "weight dtype")
        quant = self.quant if self.quant is not None and self.quant.dtype == dtype else None
        size = weight_bytes_per_param(dtype, quant.group_size if quant else None, quant.zero_point if quant else False)
        if dtype == "mxfp4" or (quant is not None and not quant.attention_quantized):
            return 2.0, size
        return size, size

    def _bf16_params(self) -> int:
        untied_head = 0 if self.tied_embeddings else self.lm_head_params
        vision = self.vision.params if self.vision else 0
        return self.router_params + self.embedding_params + untied_head + self.lookup_only_params + vision

    def weight_bytes(self, weight_dtype: str | None = None) -> float:
        """Bytes of all weights in memory."""
        attention_bpp, mlp_bpp = self._bytes_per_param(weight_dtype or self.default_weight_dtype)
        return (
            attention_bpp * self.attention_params
            + mlp_bpp * (self.dense_mlp_params + self.all_expert_params)
            + 2.0 * self._bf16_params()
        )

    def expert_weight_bytes(self, weight_dtype: str | None = None) -> float:
        """Bytes of all routed experts (the part expert parallelism shards)."""
        _attention_bpp, mlp_bpp = self._bytes_per_param(weight_dtype or self.default_weight_dtype)
        return mlp_bpp * self.all_expert_params

    def weight_bytes_per_gpu(self, weight_dtype: str | None = None, tp: int = 1, ep: int | None = None) -> float:
        """Bytes of weights one GPU holds.

        Tensor parallelism splits every layer over `tp` GPUs (vocab-parallel embedding and
        LM head included). With expert parallelism over `ep` GPUs (vLLM's
        --enable-expert-parallel, EP = TP × DP) each GPU holds E/ep whole experts, while
        attention and dense layers are split over the `tp` GPUs of its own data-parallel rank.
        """
        total = self.weight_bytes(weight_dtype)
        experts = self.expert_weight_bytes(weight_dtype)
        expert_shards = ep if ep and self.is_moe else tp
        return (total - experts) / tp + experts / expert_shards

    def expected_experts_touched(self, batch_tokens: float, spread: float = 1.0) -> float:
        """Distinct experts per MoE layer a batch of B tokens routes to: E·(1−(1−k/E)^B).

        `spread` < 1 models skewed routing (popular experts): the formula runs over an
        effective pool of spread·E experts (never fewer than k).
        """
        if not self.is_moe or batch_tokens <= 0:
            return 0.0
        pool = max(float(self.experts_per_token), spread * self.num_experts)
        pool = min(pool, float(self.num_experts))
        return pool * (1.0 - (1.0 - self.experts_per_token / pool) ** batch_tokens)

    def step_weight_bytes(self, batch_tokens: float, weight_dtype: str | None = None, spread: float = 1.0) -> float:
        """Bytes of weights one forward pass over `batch_tokens` tokens streams from memory."""
        if batch_tokens <= 0:
            return 0.0
        attention_bpp, mlp_bpp = self._bytes_per_param(weight_dtype or self.default_weight_dtype)
        experts = self.expected_experts_touched(batch_tokens, spread) * self.expert_params * self.moe_layers
        return (
            attention_bpp * self.attention_params
            + mlp_bpp * (self.dense_mlp_params + experts)
            + 2.0 * (self.router_params + self.lm_head_params)
        )

    def step_expert_bytes(self, batch_tokens: float, weight_dtype: str | None = None, spread: float = 1.0) -> float:
        """The routed-expert part of `step_weight_bytes`."""
        _attention_bpp, mlp_bpp = self._bytes_per_param(weight_dtype or self.default_weight_dtype)
        return mlp_bpp * self.expected_experts_touched(batch_tokens, spread) * self.expert_params * self.moe_layers

    def kv_bytes_per_token_by_kind(self, kv_dtype: str = "bf16") -> dict[str, float]:
        """KV bytes one token adds, per layer kind ('full', 'sliding', 'mla'); shared and linear layers add none."""
        size = KV_BYTES[normalize_kv_dtype(kv_dtype)]
        totals: dict[str, float] = {}
        for group in self.attention:
            elements = group.kv_elements_per_token()
            if elements:
                totals[group.kind] = totals.get(group.kind, 0.0) + elements * size
        return totals

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV bytes per token with no window cap (the headline figure)."""
        return sum(self.kv_bytes_per_token_by_kind(kv_dtype).values())

    def state_bytes_per_sequence(self, tp: int = 1) -> float:
        """Fixed bytes each running sequence holds in linear-attention layers (recurrent + conv state), per GPU."""
        return sum(group.state_bytes_per_sequence(tp) for group in self.attention)

    def kv_bytes_for_context(self, context_tokens: float, kv_dtype: str = "bf16") -> float:
        """KV (and linear-attention state) bytes one sequence holds, and attention reads, at this context."""
        size = KV_BYTES[normalize_kv_dtype(kv_dtype)]
        per_token = sum(group.kv_elements_per_token() * size * group.context_seen(context_tokens) for group in self.attention)
        return per_token + (self.state_bytes_per_sequence() if context_tokens > 0 else 0.0)

    def kv_bytes_for_context_per_gpu(self, context_tokens: float, kv_dtype: str = "bf16", tp: int = 1) -> float:
        """What one of `tp` GPUs holds for one sequence: KV heads split (never below one), MLA latent whole."""
        size = KV_BYTES[normalize_kv_dtype(kv_dtype)]
        per_token = sum(
            group.kv_elements_per_token_per_gpu(tp) * size * group.context_seen(context_tokens) for group in self.attention
        )
        state = self.state_bytes_per_sequence(tp) if context_tokens > 0 else 0.0
        return per_token + state

    # ---- FLOPs ------------------------------------------------------------------------
    def linear_flops_per_token(self) -> float:
        """2·active params: the matmul FLOPs one token costs in the decoder."""
        return 2.0 * self.active_params_per_token

    def routed_expert_flops_per_token(self) -> float:
        """The part of `linear_flops_per_token` spent in routed experts."""
        return 2.0 * self.experts_per_token * self.expert_params * self.moe_layers

    def lm_head_flops_per_sampled_token(self) -> float:
        return 2.0 * self.lm_head_params

    def attention_flops_per_query(self, context_tokens: float, phase: str = "prefill") -> float:
        """QKᵀ and PV FLOPs for one query token attending to `context_tokens` keys.

        `phase` matters for MLA only (vLLM decompresses K/V for prefill and attends over the
        latent for decode, see `AttentionLayers.flops_per_key`); linear-attention layers add a
        fixed state update per token whatever the context.
        """
        return sum(
            group.flops_per_key(phase) * group.context_seen(context_tokens) + group.fixed_flops_per_token()
            for group in self.attention
        )

    def prefill_flops_per_token(self, prompt_tokens: int) -> float:
        """Average FLOPs per prompt token for a causal prefill of `prompt_tokens` tokens."""
        return self.linear_flops_per_token() + self.attention_flops_per_query(prompt_tokens / 2.0)

    def decode_flops_per_token(self, context_tokens: int) -> float:
        """FLOPs for one generated token at this context (including the LM head)."""
        return (
            self.linear_flops_per_token()
            + self.attention_flops_per_query(context_tokens, phase="decode")
            + self.lm_head_flops_per_sampled_token()
        )


# ---- parsing ----------------------------------------------------------------------------


class _Fields:
    """Reads fields from a config section, failing with one line that names the field."""

    def __init__(self, section: JSONObject, source: str, prefix: str = "") -> None:
        self.section = section
        self.source = source
        self.prefix = prefix

    def need_int(self, *names: str, why: str) -> int:
        for name in names:
            value = self.section.get(name)
            if value is not None:
                return self._as_int(name, value)
        raise UserError(
            f"{self.source}: config.json has no '{self.prefix}{names[0]}' field (needed for {why}); "
            "add it, or pass a preset name (vlmserve plan models)"
        )

    def get_int(self, *names: str, default: int | None = None) -> int | None:
        for name in names:
            value = self.section.get(name)
            if value is not None:
                return self._as_int(name, value)
        return default

    def _as_int(self, name: str, value: JSONValue) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
            raise UserError(f"{self.source}: config.json field '{self.prefix}{name}' is {value!r}; it must be a whole number ≥ 0")
        return int(value)


_LAYER_TYPE_KINDS: dict[str, AttentionKind] = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "full": "full",
    "sliding_attention": "sliding",
    "sliding_window": "sliding",
    "local": "sliding",
    "sliding": "sliding",
    "linear_attention": "linear",
}


def _layer_kinds(text: JSONObject, fields: _Fields, num_layers: int) -> list[AttentionKind]:
    """Per-layer attention kind from layer_types, full_attention_interval, sliding_window_pattern or sliding_window.

    An entry of `layer_types` this module cannot price (mamba, chunked attention, ...) is refused
    in one line rather than priced as full attention.
    """
    layer_types = text.get("layer_types")
    window = text.get("sliding_window")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise UserError(
                f"{fields.source}: config.json field '{fields.prefix}layer_types' must list one entry per layer "
                f"({num_layers}); fix it or remove it"
            )
        kinds: list[AttentionKind] = []
        for entry in layer_types:
            kind = _LAYER_TYPE_KINDS.get(str(entry).strip().lower())
            if kind is None:
                raise UserError(
                    f"{fields.source}: config.json layer type '{entry}' in '{fields.prefix}layer_types' cannot be priced "
                    "(known: full_attention, sliding_attention, linear_attention)"
                )
            kinds.append(kind)
    elif text.get("full_attention_interval"):
        interval = fields.need_int("full_attention_interval", why="the linear/full layer pattern")
        kinds = ["full" if (index + 1) % max(interval, 1) == 0 else "linear" for index in range(num_layers)]
    elif text.get("sliding_window_pattern"):
        pattern = fields.need_int("sliding_window_pattern", why="the sliding/global layer pattern")
        kinds = ["full" if (index + 1) % max(pattern, 1) == 0 else "sliding" for index in range(num_layers)]
    elif window and text.get("use_sliding_window", True):
        kinds = ["sliding"] * num_layers
    else:
        kinds = ["full"] * num_layers
    if "sliding" in kinds and not window:
        raise UserError(
            f"{fields.source}: config.json has sliding layers but no '{fields.prefix}sliding_window' field "
            "(needed for the KV a sliding layer keeps); add it"
        )
    return kinds


_UNPRICED_MIXERS = ("hybrid_override_pattern", "mamba_d_state", "ssm_state_size", "attn_layer_indices", "mamba_expand")


def _refuse_unpriced_mixers(text: JSONObject, fields: _Fields) -> None:
    """State-space (Mamba) layers are not priced: say so instead of pricing them as attention."""
    for name in _UNPRICED_MIXERS:
        if name in text:
            raise UserError(
                f"{fields.source}: config.json field '{fields.prefix}{name}' declares Mamba/state-space layers, "
                "which vlmserve cannot price (their per-sequence state and scan cost are not modelled)"
            )


def _mla_shape(fields: _Fields) -> MlaShape:
    return MlaShape(
        kv_lora_rank=fields.need_int("kv_lora_rank", why="the MLA latent each token caches"),
        qk_rope_head_dim=fields.need_int("qk_rope_head_dim", why="the MLA rotary key each token caches"),
        qk_nope_head_dim=fields.need_int("qk_nope_head_dim", why="MLA query/key widths"),
        v_head_dim=fields.need_int("v_head_dim", why="MLA value width"),
        q_lora_rank=fields.get_int("q_lora_rank", default=None),
    )


def _linear_shape(text: JSONObject, fields: _Fields) -> LinearAttentionShape:
    why = "the linear-attention state each sequence keeps"
    ssm_dtype = str(text.get("mamba_ssm_dtype") or "").lower()
    return LinearAttentionShape(
        key_heads=fields.need_int("linear_num_key_heads", why=why),
        value_heads=fields.need_int("linear_num_value_heads", why=why),
        key_head_dim=fields.need_int("linear_key_head_dim", why=why),
        value_head_dim=fields.need_int("linear_value_head_dim", why=why),
        conv_kernel=fields.need_int("linear_conv_kernel_dim", why=why),
        recurrent_bytes=4.0 if ssm_dtype in ("float32", "fp32") else STATE_BYTES,
    )


def _attention_groups(text: JSONObject, fields: _Fields, hidden: int, num_layers: int) -> tuple[AttentionLayers, ...]:
    _refuse_unpriced_mixers(text, fields)
    q_heads = fields.need_int("num_attention_heads", "n_head", why="attention FLOPs")
    kv_heads = fields.get_int("num_key_value_heads", "num_kv_heads", default=q_heads) or q_heads
    head_dim = fields.get_int("head_dim", default=None) or hidden // max(q_heads, 1)
    global_kv_heads = fields.get_int("num_global_key_value_heads", default=kv_heads) or kv_heads
    global_head_dim = fields.get_int("global_head_dim", default=head_dim) or head_dim
    window = fields.get_int("sliding_window", default=None)
    shared = fields.get_int("num_kv_shared_layers", default=0) or 0
    if shared > num_layers:
        raise UserError(
            f"{fields.source}: config.json field '{fields.prefix}num_kv_shared_layers' ({shared}) exceeds "
            f"num_hidden_layers ({num_layers})"
        )
    k_eq_v = bool(text.get("attention_k_eq_v", False))
    # Qwen3-Next gates its attention output without saying so in config.json; Qwen3.5 says so
    output_gate = bool(text.get("attn_output_gate", str(text.get("model_type", "")).startswith("qwen3_next")))
    mla = _mla_shape(fields) if "kv_lora_rank" in text else None
    kinds = _layer_kinds(text, fields, num_layers)
    linear = _linear_shape(text, fields) if "linear" in kinds else None
    counts: dict[tuple[AttentionKind, bool], int] = {}
    for index, kind in enumerate(kinds):
        if mla is not None and kind == "full":
            kind = "mla"
        owns_kv = index < num_layers - shared
        counts[(kind, owns_kv)] = counts.get((kind, owns_kv), 0) + 1
    groups = []
    for (kind, owns_kv), count in sorted(counts.items(), key=lambda item: (item[0][0], not item[0][1])):
        if kind == "sliding":
            groups.append(AttentionLayers("sliding", count, q_heads, kv_heads, head_dim, window, owns_kv))
        elif kind == "mla":
            groups.append(AttentionLayers("mla", count, q_heads, 1, 0, None, owns_kv, mla=mla))
        elif kind == "linear":
            assert linear is not None
            groups.append(
                AttentionLayers("linear", count, linear.value_heads, 0, linear.value_head_dim, None, owns_kv, linear=linear)
            )
        else:
            groups.append(
                AttentionLayers(
                    "full", count, q_heads, global_kv_heads, global_head_dim, None, owns_kv, k_eq_v, output_gate=output_gate
                )
            )
    return tuple(groups)


def _vision_tower(vision: JSONValue, source: str, config: JSONObject) -> VisionTower | None:
    """Encoder params and patches per LM token from a `vision_config` section; tokens per image by
    the family's rule read from the whole config (vision.tokens), else `default_output_length`."""
    if not vision:
        return None
    if not isinstance(vision, dict):
        raise UserError(f"{source}: config.json field 'vision_config' must be an object")
    fields = _Fields(vision, source, "vision_config.")
    hidden = fields.need_int("hidden_size", "embed_dim", why="vision-encoder cost")
    layers = fields.need_int("num_hidden_layers", "depth", why="vision-encoder cost")
    intermediate = fields.get_int("intermediate_size", default=4 * hidden) or 4 * hidden
    merge = fields.get_int("spatial_merge_size", default=None)
    pooling = fields.get_int("pooling_kernel_size", default=None)
    patches_per_token = (merge or pooling or 1) ** 2
    out_hidden = fields.get_int("out_hidden_size", default=hidden) or hidden
    encoder = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    merged = hidden * patches_per_token
    projector = merged * merged + merged * out_hidden
    declared = fields.get_int("default_output_length", default=None)
    tokens_per_image = declared or 256
    estimator: ImageTokenEstimator | None = estimator_from_configs(config, {}, {})
    if isinstance(estimator, SoftTokenBudget) and declared:
        estimator = dataclasses.replace(estimator, budget=declared, source=f"vision_config.default_output_length={declared}")
    if estimator is not None and estimator.is_fallback:
        estimator = None
    return VisionTower(encoder + projector, patches_per_token, tokens_per_image, estimator)


def parse_config(config: JSONValue, name: str, source: str | None = None) -> ModelCost:
    """Turn a Hugging Face config.json dict into ModelCost (one-line UserError on bad fields)."""
    source = source or name
    if not isinstance(config, dict):
        raise UserError(f"{source}: config.json must be a JSON object")
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise UserError(f"{source}: config.json field 'text_config' must be an object")
    prefix = "text_config." if "text_config" in config else ""
    fields = _Fields(text, source, prefix)
    hidden = fields.need_int("hidden_size", "n_embd", "d_model", why="weight and FLOP counts")
    num_layers = fields.need_int("num_hidden_layers", "n_layer", "num_layers", why="per-layer costs")
    vocab = fields.need_int("vocab_size", why="the embedding and LM-head size")
    attention = _attention_groups(text, fields, hidden, num_layers)

    num_experts = fields.get_int("num_experts", "num_local_experts", "n_routed_experts", default=0) or 0
    if num_experts:
        top_k = fields.need_int(
            "num_experts_per_tok", "top_k_experts", "experts_per_token", why="the experts each token activates"
        )
        expert_width = fields.need_int("moe_intermediate_size", "intermediate_size", why="expert size")
        expert_params = 3 * hidden * expert_width
        dense_layers = fields.get_int("first_k_dense_replace", default=0) or 0
        moe_layers = num_layers - dense_layers
        shared_width = 0
        if text.get("enable_moe_block"):
            shared_width = fields.need_int("intermediate_size", why="the dense MLP beside the experts")
        shared_width += fields.get_int("shared_expert_intermediate_size", default=0) or 0
        shared_width += (fields.get_int("n_shared_experts", "num_shared_experts", default=0) or 0) * expert_width
        dense_width = fields.get_int("intermediate_size", default=expert_width) or expert_width
        dense_mlp = moe_layers * 3 * hidden * shared_width + dense_layers * 3 * hidden * dense_width
        router = moe_layers * hidden * num_experts
    else:
        top_k = expert_params = moe_layers = router = 0
        intermediate = fields.need_int("intermediate_size", "n_inner", "ffn_dim", why="MLP weights")
        dense_mlp = num_layers * 3 * hidden * intermediate

    per_layer_width = fields.get_int("hidden_size_per_layer_input", default=0) or 0
    per_layer_vocab = fields.get_int("vocab_size_per_layer_input", default=vocab) or vocab
    lookup_only = per_layer_width * num_layers * per_layer_vocab
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))

    quant = parse_quantization(config.get("quantization_config") or text.get("quantization_config"), source)
    default_dtype = quant.dtype if quant is not None else "bf16"

    notes = tuple(
        str(section["_vlmserve_note"])
        for section in (config, text, config.get("vision_config") or {})
        if isinstance(section, dict) and "_vlmserve_note" in section
    )
    if config.get("audio_config"):
        notes += ("the audio encoder is not priced",)
    return ModelCost(
        name=name,
        hidden_size=hidden,
        num_layers=num_layers,
        vocab_size=vocab,
        attention=attention,
        dense_mlp_params=dense_mlp,
        expert_params=expert_params,
        moe_layers=moe_layers,
        num_experts=num_experts,
        experts_per_token=top_k,
        router_params=router,
        embedding_params=vocab * hidden,
        tied_embeddings=tied,
        lookup_only_params=lookup_only,
        vision=_vision_tower(config.get("vision_config"), source, config),
        default_weight_dtype=default_dtype,
        max_position_embeddings=fields.get_int("max_position_embeddings", default=None),
        notes=notes,
        quant=quant,
    )


class PresetEntry(TypedDict):
    """One preset in the package's index.json."""

    file: str
    aliases: list[str]


@cache
def preset_index() -> dict[str, PresetEntry]:
    """Preset name → {'file', 'aliases'} from the package data."""
    return json.loads(resources.files(PRESET_PACKAGE).joinpath("index.json").read_text())


def preset_names() -> list[str]:
    return sorted(preset_index())


def preset_config(name: str) -> JSONObject:
    """The HF-style config.json content of a preset."""
    entry = preset_index()[name]
    return json.loads(resources.files(PRESET_PACKAGE).joinpath(entry["file"]).read_text())


def resolve_preset(name: str) -> str | None:
    """Canonical preset name for a name or alias (case-insensitive), or None."""
    wanted = name.strip().lower()
    for canonical, entry in preset_index().items():
        candidates = [canonical, canonical.split("/")[-1], *entry.get("aliases", [])]
        if wanted in (candidate.lower() for candidate in candidates):
            return canonical
    return None


def load_model(spec: str) -> ModelCost:
    """A preset name/alias, a config.json path, or a directory holding config.json."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        config = read_json_file(path, "file", "give a config.json path or a preset name (vlmserve plan models)")
        named = config.get("_name_or_path") if isinstance(config, dict) else None  # parse_config refuses a non-object
        return parse_config(config, name=str(named or path.parent.name or path.stem), source=str(path))
    canonical = resolve_preset(spec)
    if canonical is None:
        raise UserError(f"unknown model '{spec}'; give a path to a config.json or one of: {', '.join(preset_names())}")
    return parse_config(preset_config(canonical), name=canonical, source=f"preset {canonical}")
