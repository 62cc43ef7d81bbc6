"""`MeasuredStepCost`: a scheduler step priced as the sum of the vLLM kernels it runs.

Per decoder layer, on one GPU of the tensor-parallel group (every GPU runs the same kernels at
once, so one GPU's time is the step's): the QKV and O projections and the MLP's gate/up and
down GEMMs at their real (m = tokens in the step, n, k, weight format); attention for the
step's prefill chunks (context table) and decodes (generation table); the MoE layer (moe
table); two all-reduces of the hidden states under TP (comm table); norms and activations
(memory-bound, roofline). Once per step: the LM head for the sequences that sample, and the
vision encoder (ViT GEMMs and encoder attention) for the images encoded in the step. The
engine's CPU work per step comes from the calibration, as in the roofline model, and overlaps
the GPU under async scheduling.

Each op class has one `Source`: the measured table (file, GPU, vLLM version) or "roofline"
with the reason; `sources()` is what `plan --explain` prints.

Speed: the linear-layer part depends only on the step's token count and the LM head only on
its sequence count; attention depends on (sequences, context), rounded to `CONTEXT_BUCKET`
tokens. Each is cached, so a step costs a few dict lookups once the cache is warm.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vlmserve.hardware.calibration import Efficiency
from vlmserve.hardware.cost import frontend_step_s
from vlmserve.hardware.dtypes import normalize_kv_dtype
from vlmserve.hardware.gpus import GPU
from vlmserve.hardware.kernels.ops import (
    ROOFLINE,
    AllReducePricer,
    AttentionPricer,
    AttentionShape,
    EncoderAttentionPricer,
    GemmPricer,
    MoePricer,
    Source,
)
from vlmserve.hardware.kernels.quant import bytes_per_weight, weight_format
from vlmserve.hardware.kernels.roofline_ops import ACTIVATION_BYTES, OpRoofline
from vlmserve.hardware.kernels.vision_shape import VisionShape
from vlmserve.hardware.models import AttentionLayers, ModelCost
from vlmserve.sched.step_cost import StepContents

CONTEXT_BUCKET = 16
"""Attention contexts are priced at the nearest multiple of this (vLLM's KV block size) for caching."""

HIDDEN_PASSES_PER_LAYER = 8
"""Reads and writes of the hidden state per layer outside GEMMs and attention: two fused
residual-add + RMSNorm kernels, each reading and writing the hidden state and the residual."""

OP_CLASSES = (
    "gemm: attention projections (QKV, O)",
    "gemm: MLP (gate/up, down) and router",
    "moe: routed experts",
    "gemm: LM head",
    "attention: prefill (context)",
    "attention: decode (generation)",
    "all-reduce (tensor parallel)",
    "elementwise (norms, activations)",
    "vision encoder: GEMMs",
    "vision encoder: attention",
)
PROJ, MLP, MOE, LM_HEAD, PREFILL_ATTN, DECODE_ATTN, ALLREDUCE, ELEMENTWISE, VIT_GEMM, VIT_ATTN = OP_CLASSES


@dataclass(frozen=True)
class KernelBreakdown:
    """Seconds per op class for one step, plus the CPU overhead."""

    parts: dict[str, float]
    overhead_s: float
    overlapped: bool = False
    frontend_s: float = 0.0
    """The API server's CPU for the step (`hardware.cost.frontend_step_s`): the step takes the longer of it and the engine."""

    @property
    def gpu_s(self) -> float:
        return sum(self.parts.values())

    @property
    def total_s(self) -> float:
        engine = max(self.gpu_s, self.overhead_s) if self.overlapped else self.gpu_s + self.overhead_s
        return max(engine, self.frontend_s)


@dataclass(frozen=True)
class GemmShape:
    """`count` GEMMs of per-GPU shape (n, k) per forward pass."""

    count: int
    n: int
    k: int


def _split(total: int, tp: int) -> int:
    """A dimension sharded over TP (at least 1: small KV head counts are replicated)."""
    return max(total // tp, 1)


@dataclass
class MeasuredStepCost:
    """Prices StepContents for `model` on `tp` × `gpu` from measured vLLM kernel tables."""

    model: ModelCost
    gpu: GPU
    tp: int
    weight_dtype: str
    kv_dtype: str
    efficiency: Efficiency
    async_scheduling: bool = False
    vllm_version: str | None = None
    vision: VisionShape | None = None
    ep: int | None = None
    """Expert-parallel GPUs (vLLM --enable-expert-parallel): experts whole on ep GPUs instead of split by TP."""
    api_servers: int = 1
    """vLLM's --api-server-count: the processes that share `frontend_step_s`."""
    _linear_cache: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)
    _lm_cache: dict[int, float] = field(default_factory=dict, repr=False)
    _attn_cache: dict[tuple[int, int, int, int, int], tuple[float, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        model, tp, version, key = self.model, self.tp, self.vllm_version, self.gpu.key
        self.roof = OpRoofline(self.gpu, self.efficiency)
        weight = weight_format(self.weight_dtype)
        # Checkpoints quantised MLP-only (MXFP4: gpt-oss) keep bf16 attention projections.
        projection_weight = "bf16" if weight == "mxfp4" else weight
        self._proj = GemmPricer(key, projection_weight, self.roof, version)
        self._mlp = GemmPricer(key, weight, self.roof, version)
        self._bf16 = GemmPricer(key, "bf16", self.roof, version)
        self._vit = GemmPricer(key, "bf16", self.roof, version)  # apart from the LM head's: own extrapolation record
        self._proj_shapes = self._projection_shapes()
        self._mlp_shapes = self._mlp_gemm_shapes()
        self._router = GemmShape(model.moe_layers, model.num_experts, model.hidden_size) if model.is_moe else None
        self._attention = [(group.count, self._attention_pricer(group)) for group in model.attention]
        self._moe = self._moe_pricer(weight) if model.is_moe else None
        self._allreduce = AllReducePricer(key, tp, self.roof, version)
        self._vit_attention = (
            EncoderAttentionPricer(key, _split(self.vision.heads, tp), self.vision.head_dim, self.roof, version)
            if self.vision
            else None
        )
        self._intermediate_per_gpu = self._mlp_shapes[1].k if len(self._mlp_shapes) > 1 else 0

    # ---- shapes -------------------------------------------------------------------------
    def _projection_shapes(self) -> list[GemmShape]:
        """QKV (fused, with the output gate where the model has one) and O per attention group, sharded by
        heads over TP. Groups the tables' attention cannot price (MLA, linear attention) run projections of
        their own shapes; they are priced as one GEMM per layer of the same weight count (k = hidden)."""
        shapes = []
        hidden = self.model.hidden_size
        for group in self.model.attention:
            if _unmodelled(group):
                per_layer = group.params(hidden) // max(group.count, 1)
                shapes.append(GemmShape(group.count, max(per_layer // hidden // self.tp, 1), hidden))
                continue
            q = _split(group.q_heads, self.tp) * group.head_dim
            gate = q if getattr(group, "output_gate", False) else 0
            kv_projections = 0 if not group.owns_kv else (1 if group.k_eq_v else 2)
            kv = kv_projections * _split(group.kv_heads, self.tp) * group.head_dim
            shapes.append(GemmShape(group.count, q + gate + kv, hidden))
            shapes.append(GemmShape(group.count, hidden, q))
        return shapes

    def _mlp_gemm_shapes(self) -> list[GemmShape]:
        """Gate/up (fused) and down at the mean always-active MLP width per layer (dense MLPs and shared experts)."""
        model = self.model
        if model.dense_mlp_params <= 0:
            return []
        width = round(model.dense_mlp_params / (3 * model.hidden_size * model.num_layers))
        per_gpu = _split(width, self.tp)
        return [
            GemmShape(model.num_layers, 2 * per_gpu, model.hidden_size),
            GemmShape(model.num_layers, model.hidden_size, per_gpu),
        ]

    def _attention_pricer(self, group: AttentionLayers) -> AttentionPricer | None:
        """The tables' pricer for a standard (full or sliding, MHA/GQA) group; None → the roofline, labelled."""
        if _unmodelled(group):
            return None
        shape = AttentionShape(
            _split(group.q_heads, self.tp),
            _split(group.kv_heads, self.tp),
            group.head_dim,
            normalize_kv_dtype(self.kv_dtype),
            group.window,
        )
        return AttentionPricer(self.gpu.key, shape, self.roof, self.vllm_version)

    def _moe_pricer(self, weight: str) -> MoePricer:
        model = self.model
        width = round(model.expert_params / (3 * model.hidden_size))
        moe_tp, moe_ep = (1, self.ep) if self.ep else (self.tp, 1)
        return MoePricer(
            self.gpu.key,
            weight,
            model.hidden_size,
            width,
            model.experts_per_token,
            model.num_experts,
            moe_tp,
            self.roof,
            self._moe_roofline_layer_s,
            self.vllm_version,
            ep=moe_ep,
        )

    def _moe_roofline_layer_s(self, tokens: float, roof: OpRoofline | None = None) -> float:
        """One MoE layer on the roofline (this GPU's unless `roof` names another): routed FLOPs, and
        the bytes of the experts the tokens touch (split over the TP GPUs, or whole experts over the EP GPUs)."""
        roof = roof or self.roof
        model = self.model
        spread = self.efficiency.moe_expert_spread
        shards = self.ep or self.tp
        flops = 2.0 * tokens * model.experts_per_token * model.expert_params / shards
        nbytes = (
            model.expected_experts_touched(tokens, spread) * model.expert_params * bytes_per_weight(self.weight_dtype) / shards
        )
        return roof.time_s(flops, nbytes, self.weight_dtype) / max(self.efficiency.moe_efficiency, 1e-6)

    # ---- pricing ------------------------------------------------------------------------
    def _linear_parts(self, tokens: int) -> dict[str, float]:
        """Everything whose cost depends only on the step's token count (cached per count)."""
        cached = self._linear_cache.get(tokens)
        if cached is not None:
            return cached
        model = self.model
        proj = sum(shape.count * self._proj.seconds(tokens, shape.n, shape.k) for shape in self._proj_shapes)
        mlp = sum(shape.count * self._mlp.seconds(tokens, shape.n, shape.k) for shape in self._mlp_shapes)
        if self._router is not None:
            mlp += self._router.count * self._bf16.seconds(tokens, self._router.n, self._router.k)
        moe = model.moe_layers * self._moe.seconds(tokens) if self._moe is not None else 0.0
        allreduce = 2 * model.num_layers * self._allreduce.seconds(tokens * model.hidden_size)
        passes = HIDDEN_PASSES_PER_LAYER * model.hidden_size + 3 * self._intermediate_per_gpu
        elementwise = self.roof.stream_s(model.num_layers * tokens * passes * ACTIVATION_BYTES)
        cached = {PROJ: proj, MLP: mlp, MOE: moe, ALLREDUCE: allreduce, ELEMENTWISE: elementwise}
        self._linear_cache[tokens] = cached
        return cached

    def _lm_head_s(self, seqs: int) -> float:
        cached = self._lm_cache.get(seqs)
        if cached is None:
            cached = self._bf16.seconds(seqs, _split(self.model.vocab_size, self.tp), self.model.hidden_size)
            self._lm_cache[seqs] = cached
        return cached

    def _attention_s(self, prefill_seqs: int, chunk: int, end: int, decode_seqs: int, decode_context: int) -> tuple[float, float]:
        key = (prefill_seqs, chunk, end, decode_seqs, decode_context)
        cached = self._attn_cache.get(key)
        if cached is not None:
            return cached
        prefill = decode = 0.0
        for count, pricer in self._attention:
            if pricer is None:
                continue
            prefill += count * pricer.prefill_s(prefill_seqs, chunk, end)
            decode += count * pricer.decode_s(decode_seqs, decode_context)
        roofline_prefill, roofline_decode = self._attention_roofline_s(prefill_seqs, chunk, end, decode_seqs, decode_context)
        self._attn_cache[key] = (prefill + roofline_prefill, decode + roofline_decode)
        return self._attn_cache[key]

    def _attention_roofline_s(
        self, prefill_seqs: int, chunk: int, end: int, decode_seqs: int, decode_context: int
    ) -> tuple[float, float]:
        """(prefill, decode) seconds of the attention groups no table can price (another kind, e.g. linear
        attention or MLA), on the model's own roofline terms (FLOPs per query, KV bytes per context)."""
        unpriced = tuple(group for group, (_count, pricer) in zip(self.model.attention, self._attention) if pricer is None)
        if not unpriced:
            return 0.0, 0.0
        part = dataclasses.replace(self.model, attention=unpriced)
        fixed = sum(group.fixed_flops_per_token() for group in unpriced)  # linear attention's state update
        prefill = (
            self.roof.time_s(
                prefill_seqs * chunk * (part.attention_flops_per_query(max(end - chunk / 2.0, 1.0), "prefill") + fixed) / self.tp,
                prefill_seqs * part.kv_bytes_for_context_per_gpu(end, self.kv_dtype, self.tp),
            )
            if prefill_seqs
            else 0.0
        )
        decode = (
            self.roof.time_s(
                decode_seqs * (part.attention_flops_per_query(decode_context, "decode") + fixed) / self.tp,
                decode_seqs * part.kv_bytes_for_context_per_gpu(decode_context, self.kv_dtype, self.tp),
            )
            if decode_seqs
            else 0.0
        )
        return prefill, decode

    def _vision_parts(self, image_tokens: int, images: int) -> tuple[float, float]:
        """ViT GEMMs (+ its TP all-reduces) and encoder attention for the images encoded this step."""
        vision = self.vision
        if image_tokens <= 0:
            return 0.0, 0.0
        if vision is None or self._vit_attention is None:
            tower = self.model.vision
            if tower is None:
                return 0.0, 0.0
            flops = image_tokens * tower.flops_per_image_token / self.tp
            return self.roof.time_s(flops, 2.0 * tower.params / self.tp), 0.0
        patches = image_tokens * vision.patches_per_token
        hidden, width = vision.hidden, _split(vision.intermediate, self.tp)
        heads_width = _split(vision.heads, self.tp) * vision.head_dim
        per_layer = (
            self._vit.seconds(patches, 3 * heads_width, hidden)
            + self._vit.seconds(patches, hidden, heads_width)
            + self._vit.seconds(patches, width, hidden)
            + self._vit.seconds(patches, hidden, width)
            + 2 * self._allreduce.seconds(patches * hidden)
        )
        projector = self._vit.seconds(image_tokens, vision.merged, vision.merged) + self._vit.seconds(
            image_tokens, vision.out_hidden, vision.merged
        )
        per_image = patches / max(images, 1)
        attention = vision.layers * self._vit_attention.seconds(max(images, 1), per_image)
        return vision.layers * per_layer + projector, attention

    def breakdown(self, step: StepContents) -> KernelBreakdown:
        """Seconds per op class, and the CPU overhead, of one step."""
        eff = self.efficiency
        seqs = step.prefill_seqs + step.decode_seqs
        overhead = eff.step_overhead_s + eff.per_seq_overhead_s * seqs
        tokens = step.batch_tokens
        parts = dict.fromkeys(OP_CLASSES, 0.0)
        if tokens > 0:
            parts.update(self._linear_parts(tokens))
            parts[LM_HEAD] = self._lm_head_s(seqs)
            chunk, end, decode_context = _contexts(step)
            prefill, decode = self._attention_s(step.prefill_seqs, chunk, end, step.decode_seqs, decode_context)
            parts[PREFILL_ATTN], parts[DECODE_ATTN] = prefill, decode
        if step.image_tokens > 0:
            parts[VIT_GEMM], parts[VIT_ATTN] = self._vision_parts(step.image_tokens, step.images)
        return KernelBreakdown(parts, overhead, self.async_scheduling, frontend_step_s(eff, step, self.api_servers))

    def step_time_s(self, step: StepContents) -> float:
        """Seconds the step takes: the kernels' sum plus (or, async, overlapping) the CPU overhead."""
        return self.breakdown(step).total_s

    # ---- provenance ---------------------------------------------------------------------
    def sources(self) -> dict[str, Source]:
        """Where each op class's cost comes from (the table, GPU and vLLM version, or the roofline and why)."""
        model = self.model
        found: dict[str, Source] = {PROJ: self._proj.source}
        if self._mlp_shapes:
            found[MLP] = self._mlp.source
        if self._moe is not None:
            found[MOE] = self._moe.source
        found[LM_HEAD] = self._bf16.source
        found[PREFILL_ATTN] = _merge(
            [p.context_source if p else _unpriced(g) for g, (_c, p) in zip(model.attention, self._attention)]
        )
        found[DECODE_ATTN] = _merge(
            [p.generation_source if p else _unpriced(g) for g, (_c, p) in zip(model.attention, self._attention)]
        )
        if self.tp > 1:
            found[ALLREDUCE] = self._allreduce.source
        found[ELEMENTWISE] = Source(ROOFLINE, "memory-bound; no table measures norms and activations")
        if model.vision is not None:
            if self.vision is None or self._vit_attention is None:
                found[VIT_GEMM] = Source(ROOFLINE, "vision config shapes unknown: priced from the tower's parameter count")
            else:
                found[VIT_GEMM] = self._vit.source
                found[VIT_ATTN] = self._vit_attention.source
        return found

    @property
    def all_measured(self) -> bool:
        return all(source.measured for name, source in self.sources().items() if name != ELEMENTWISE)


MODELLED_GROUP_FIELDS = frozenset(
    {"kind", "count", "q_heads", "kv_heads", "head_dim", "window", "owns_kv", "k_eq_v", "output_gate"}
)
"""The attention-group fields the tables' attention kernels account for. A group with any other
field set (an MLA latent rank, a linear-attention state, ...) is not standard attention: it goes
to the roofline, named, rather than being read from the MHA/GQA rows."""


def _unmodelled(group: object) -> str | None:
    """Why the MHA/GQA tables cannot price this attention group (None when they can)."""
    kind = getattr(group, "kind", "full")
    if kind not in ("full", "sliding"):
        return f"{kind} attention: no measured table for this kind"
    if dataclasses.is_dataclass(group):
        extra = [
            f.name
            for f in dataclasses.fields(group)
            if f.name not in MODELLED_GROUP_FIELDS and getattr(group, f.name) not in (None, 0, False, "", ())
        ]
        if extra:
            return f"attention with {', '.join(extra)}: not the MHA/GQA kernels the tables measured"
    return None


def _unpriced(group: object) -> Source:
    return Source(ROOFLINE, _unmodelled(group) or "no measured table")


def _merge(sources: list[Source]) -> Source:
    """One Source for an op class priced per attention group (distinct labels joined)."""
    unique: list[Source] = []
    for source in sources:
        if all(source.describe() != seen.describe() for seen in unique):
            unique.append(source)
    if len(unique) == 1:
        return unique[0]
    label = " + ".join(source.label for source in unique)
    note = "; ".join(source.note for source in unique if source.note)
    merged = Source(label if all(s.measured for s in unique) else f"{ROOFLINE} (partly): {label}", note)
    merged.extrapolated = any(source.extrapolated for source in unique)
    return merged


def _bucket(tokens: float) -> int:
    return (
        max(int(round(tokens / CONTEXT_BUCKET)) * CONTEXT_BUCKET, 1) if tokens >= CONTEXT_BUCKET else max(int(round(tokens)), 1)
    )


def _contexts(step: StepContents) -> tuple[int, int, int]:
    """(prefill chunk, prefill end context, decode context), each a per-sequence mean, from one step's totals.

    The scheduler reports only the total context read; it is split so that a prefill chunk ends at
    no less than its own length and decodes take the rest (equal means when that is consistent).
    """
    seqs = step.prefill_seqs + step.decode_seqs
    mean = step.kv_tokens_read / seqs if seqs else 0.0
    if not step.prefill_seqs:
        return 0, 0, _bucket(mean)
    chunk = step.prefill_tokens / step.prefill_seqs
    if not step.decode_seqs:
        return _bucket(chunk), _bucket(max(mean, chunk)), 0
    end = max(chunk, mean)
    decode = max((step.kv_tokens_read - step.prefill_seqs * end) / step.decode_seqs, 1.0)
    return _bucket(chunk), _bucket(end), _bucket(decode)
