"""Hugging Face `config.json` → the cost terms the roofline model prices.

The planner never loads weights: everything it needs (bytes to stream per step, FLOPs per
token, KV bytes per token per layer kind, vision-encoder work per image token) follows from
the architecture fields of `config.json`. This module reads those fields for dense, GQA,
MoE (routed + shared experts), sliding/global attention mixes, cross-layer KV sharing and a
vision tower, and ships presets for the models in the project's reference table.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import bytes_per_element, normalize_dtype
from vlmserve.hardware.jsonfile import read_json_file
from vlmserve.vision.tokens import ImageTokenEstimator, SoftTokenBudget, estimator_from_configs

AttentionKind = Literal["full", "sliding"]

PRESET_PACKAGE = "vlmserve.hardware.presets"


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

    def params(self, hidden_size: int) -> int:
        """Projection weights of all layers in the group."""
        q_and_o = 2 * hidden_size * self.q_heads * self.head_dim
        kv_projections = 0 if not self.owns_kv else (1 if self.k_eq_v else 2)
        k_and_v = kv_projections * hidden_size * self.kv_heads * self.head_dim
        return self.count * (q_and_o + k_and_v)

    def kv_elements_per_token(self) -> int:
        """K and V elements one token adds to this group's cache (0 when shared)."""
        return 2 * self.count * self.kv_heads * self.head_dim if self.owns_kv else 0

    def context_seen(self, context_tokens: float) -> float:
        """Tokens one query attends to (capped at the window for sliding layers)."""
        if self.window is not None:
            return min(context_tokens, float(self.window))
        return context_tokens


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
            self.attention_params + self.dense_mlp_params + self.all_expert_params + self.router_params
            + self.embedding_params + untied_head + self.lookup_only_params + vision
        )

    @property
    def active_params_per_token(self) -> int:
        """Weights one token multiplies through in the decoder (without the LM head)."""
        routed = self.experts_per_token * self.expert_params * self.moe_layers
        return self.attention_params + self.dense_mlp_params + self.router_params + routed

    # ---- bytes ------------------------------------------------------------------------
    def _bytes_per_param(self, weight_dtype: str) -> tuple[float, float]:
        """(attention projections, MLP/expert) bytes per weight for a weight format.

        FP8 checkpoints quantize every decoder linear layer; MXFP4 checkpoints (gpt-oss)
        quantize the MLP/expert weights only. Embeddings, LM head, router and vision tower
        stay BF16 in both.
        """
        dtype = normalize_dtype(weight_dtype, "weight dtype")
        size = bytes_per_element(dtype)
        if dtype == "mxfp4":
            return 2.0, size
        return size, size

    def weight_bytes(self, weight_dtype: str | None = None) -> float:
        """Bytes of all weights in memory."""
        attention_bpp, mlp_bpp = self._bytes_per_param(weight_dtype or self.default_weight_dtype)
        untied_head = 0 if self.tied_embeddings else self.lm_head_params
        vision = self.vision.params if self.vision else 0
        bf16_params = self.router_params + self.embedding_params + untied_head + self.lookup_only_params + vision
        return (
            attention_bpp * self.attention_params
            + mlp_bpp * (self.dense_mlp_params + self.all_expert_params)
            + 2.0 * bf16_params
        )

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
        """KV bytes one token adds, per layer kind ('full', 'sliding'); shared layers add none."""
        size = bytes_per_element(normalize_dtype(kv_dtype, "KV cache dtype"))
        totals: dict[str, float] = {}
        for group in self.attention:
            if group.owns_kv:
                totals[group.kind] = totals.get(group.kind, 0.0) + group.kv_elements_per_token() * size
        return totals

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """KV bytes per token with no window cap (the headline figure)."""
        return sum(self.kv_bytes_per_token_by_kind(kv_dtype).values())

    def kv_bytes_for_context(self, context_tokens: float, kv_dtype: str = "bf16") -> float:
        """KV bytes one sequence holds (and attention reads) at this context length."""
        size = bytes_per_element(normalize_dtype(kv_dtype, "KV cache dtype"))
        return sum(
            group.kv_elements_per_token() * size * group.context_seen(context_tokens)
            for group in self.attention
            if group.owns_kv
        )

    # ---- FLOPs ------------------------------------------------------------------------
    def linear_flops_per_token(self) -> float:
        """2·active params: the matmul FLOPs one token costs in the decoder."""
        return 2.0 * self.active_params_per_token

    def routed_expert_flops_per_token(self) -> float:
        """The part of `linear_flops_per_token` spent in routed experts."""
        return 2.0 * self.experts_per_token * self.expert_params * self.moe_layers

    def lm_head_flops_per_sampled_token(self) -> float:
        return 2.0 * self.lm_head_params

    def attention_flops_per_query(self, context_tokens: float) -> float:
        """QKᵀ and PV FLOPs for one query token attending to `context_tokens` keys."""
        return sum(
            4.0 * group.count * group.q_heads * group.head_dim * group.context_seen(context_tokens)
            for group in self.attention
        )

    def prefill_flops_per_token(self, prompt_tokens: int) -> float:
        """Average FLOPs per prompt token for a causal prefill of `prompt_tokens` tokens."""
        return self.linear_flops_per_token() + self.attention_flops_per_query(prompt_tokens / 2.0)

    def decode_flops_per_token(self, context_tokens: int) -> float:
        """FLOPs for one generated token at this context (including the LM head)."""
        return (
            self.linear_flops_per_token()
            + self.attention_flops_per_query(context_tokens)
            + self.lm_head_flops_per_sampled_token()
        )


# ---- parsing ----------------------------------------------------------------------------


class _Fields:
    """Reads fields from a config section, failing with one line that names the field."""

    def __init__(self, section: dict[str, Any], source: str, prefix: str = "") -> None:
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

    def _as_int(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
            raise UserError(
                f"{self.source}: config.json field '{self.prefix}{name}' is {value!r}; it must be a whole number ≥ 0"
            )
        return int(value)


def _layer_kinds(text: dict[str, Any], fields: _Fields, num_layers: int) -> list[AttentionKind]:
    """Per-layer attention kind from layer_types, sliding_window_pattern or sliding_window."""
    layer_types = text.get("layer_types")
    window = text.get("sliding_window")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise UserError(
                f"{fields.source}: config.json field '{fields.prefix}layer_types' must list one entry per layer "
                f"({num_layers}); fix it or remove it"
            )
        kinds: list[AttentionKind] = ["sliding" if "sliding" in str(kind) else "full" for kind in layer_types]
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


def _attention_groups(text: dict[str, Any], fields: _Fields, hidden: int, num_layers: int) -> tuple[AttentionLayers, ...]:
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
    kinds = _layer_kinds(text, fields, num_layers)
    counts: dict[tuple[AttentionKind, bool], int] = {}
    for index, kind in enumerate(kinds):
        owns_kv = index < num_layers - shared
        counts[(kind, owns_kv)] = counts.get((kind, owns_kv), 0) + 1
    groups = []
    for (kind, owns_kv), count in sorted(counts.items(), key=lambda item: (item[0][0], not item[0][1])):
        if kind == "sliding":
            groups.append(AttentionLayers("sliding", count, q_heads, kv_heads, head_dim, window, owns_kv))
        else:
            groups.append(
                AttentionLayers("full", count, q_heads, global_kv_heads, global_head_dim, None, owns_kv, k_eq_v)
            )
    return tuple(groups)


def _vision_tower(vision: dict[str, Any] | None, source: str, config: dict[str, Any]) -> VisionTower | None:
    """Encoder params and patches per LM token from a `vision_config` section; tokens per image by
    the family's rule read from the whole config (vision.tokens), else `default_output_length`."""
    if not vision:
        return None
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


def parse_config(config: dict[str, Any], name: str, source: str | None = None) -> ModelCost:
    """Turn a Hugging Face config.json dict into ModelCost (one-line UserError on bad fields)."""
    source = source or name
    if not isinstance(config, dict):
        raise UserError(f"{source}: config.json must be a JSON object")
    text = config.get("text_config") or config
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

    quant = config.get("quantization_config") or text.get("quantization_config") or {}
    quant_method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    default_dtype = "mxfp4" if quant_method == "mxfp4" else "fp8" if quant_method in ("fp8", "compressed-tensors-fp8") else "bf16"

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
    )


@cache
def preset_index() -> dict[str, dict[str, Any]]:
    """Preset name → {'file', 'aliases'} from the package data."""
    return json.loads(resources.files(PRESET_PACKAGE).joinpath("index.json").read_text())


def preset_names() -> list[str]:
    return sorted(preset_index())


def preset_config(name: str) -> dict[str, Any]:
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
        return parse_config(config, name=str(config.get("_name_or_path") or path.parent.name or path.stem), source=str(path))
    canonical = resolve_preset(spec)
    if canonical is None:
        raise UserError(
            f"unknown model '{spec}'; give a path to a config.json or one of: {', '.join(preset_names())}"
        )
    return parse_config(preset_config(canonical), name=canonical, source=f"preset {canonical}")
