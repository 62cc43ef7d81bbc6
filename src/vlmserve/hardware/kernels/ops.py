"""Measured pricing of one kernel family on one GPU, with the roofline where the tables stop.

Each pricer is built once per deployment (it resolves its table and records its source) and
then answers shape queries in seconds. A pricer whose table is missing, or that meets a shape
or dtype no table measured, uses `OpRoofline` for that query; `source` says which applies and
`extrapolated` whether any query left the measured range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from vlmserve.hardware.gpus import get_gpu
from vlmserve.hardware.kernels import tables
from vlmserve.hardware.kernels.interp import interp_curve
from vlmserve.hardware.kernels.locate import TableRef, locate_table
from vlmserve.hardware.kernels.quant import WEIGHT_ONLY_SLOWDOWN, KernelChoice, gemm_kernel, moe_kernel
from vlmserve.hardware.kernels.roofline_ops import OpRoofline

MS = 1e-3
ROOFLINE = "roofline"

DONOR_GPUS = ("h100", "h200", "b200")
"""Where a GPU's own table lacks an op's shape (the A100 tables have no MoE rows at all), the first of
these whose table measured it prices it: the donor's measured latency × this GPU's roofline time /
the donor's roofline time for the same op (the same efficiency on both, so the ratio is the two
GPUs' peak compute or bandwidth, whichever bounds the op). The measured curve keeps what the
roofline misses — small per-expert batches, tile quantisation, routing — instead of a fitted
efficiency constant; the hardware ratio comes from the datasheets."""


@dataclass
class Source:
    """Where one op class's cost comes from: a measured table (file, GPU, vLLM version) or the roofline."""

    label: str
    note: str = ""
    extrapolated: bool = False

    @property
    def measured(self) -> bool:
        return self.label != ROOFLINE

    def describe(self) -> str:
        parts = [self.label] + ([self.note] if self.note else [])
        if self.extrapolated:
            parts.append("beyond the measured range in some steps: scaled by the roofline")
        return "; ".join(parts)


@dataclass
class GemmPricer:
    """GEMMs of one weight format on one GPU (vLLM's linear layers)."""

    gpu_key: str
    weight: str
    roof: OpRoofline
    vllm_version: str | None = None
    source: Source = field(init=False)
    _table: tables.GemmTable | None = field(init=False, default=None)
    _choice: KernelChoice = field(init=False)

    def __post_init__(self) -> None:
        gpu = self.roof.gpu
        self._choice = gemm_kernel(self.weight, bool(gpu.fp8_tflops), bool(gpu.fp4_tflops))
        ref = locate_table(self.gpu_key, "gemm", "gemm_perf", self.vllm_version)
        if ref is not None:
            for dtype in self._choice.table_dtypes:
                self._table = tables.gemm_table(ref, dtype)
                if self._table is not None:
                    break
        if self._table is None:
            why = self._choice.note or ("no measured GEMM table for this GPU" if ref is None else "dtype not measured")
            self.source = Source(ROOFLINE, why)
        else:
            self.source = Source(f"{self._table.ref.label}, {self._table.dtype}", self._choice.note)

    def seconds(self, m: float, n: float, k: float) -> float:
        if m <= 0:
            return 0.0
        if self._table is None:
            return self.roof.gemm_s(m, n, k, self.weight)
        choice = self._choice
        compute = "bf16" if choice.weight_only or choice.roofline_scaled else self.weight
        value, beyond = self._table.latency_ms(m, n, k, lambda a, b, c: self.roof.gemm_s(a, b, c, compute))
        self.source.extrapolated |= beyond
        if choice.roofline_scaled:
            value *= self.roof.gemm_s(m, n, k, self.weight) / self.roof.gemm_s(m, n, k, "bf16")
        return value * MS * (WEIGHT_ONLY_SLOWDOWN if choice.weight_only else 1.0)


KV_TABLE_DTYPE = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}


@dataclass(frozen=True)
class AttentionShape:
    """One attention layer's per-GPU shape."""

    q_heads: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    window: int | None

    @property
    def kv_bytes(self) -> float:
        return 1.0 if self.kv_dtype == "fp8" else 2.0


def _nearest_key(keys: list[tuple[Any, ...]], shape: AttentionShape, window: int) -> tuple[tuple[Any, ...], float] | None:
    """The measured (heads, kv heads) with the same head size, KV dtype, window and GQA ratio, nearest in
    heads; latency scales by the head ratio (attention work is linear in heads at a fixed ratio)."""
    kv = KV_TABLE_DTYPE.get(shape.kv_dtype)
    exact = (shape.q_heads, shape.kv_heads, shape.head_dim, kv, window)
    if exact in keys:
        return exact, 1.0
    ratio = shape.q_heads / shape.kv_heads
    candidates = [key for key in keys if key[2:] == (shape.head_dim, kv, window) and key[0] / key[1] == ratio]
    if not candidates:
        return None
    best = min(candidates, key=lambda key: abs(math.log(key[0] / shape.q_heads)))
    return best, shape.q_heads / best[0]


@dataclass
class AttentionPricer:
    """Prefill (context) and decode (generation) attention for one layer shape on one GPU.

    Windows: a window the table measured is read directly; any other window prices full
    attention over the context the window keeps (the same work), from the window-0 rows.
    """

    gpu_key: str
    shape: AttentionShape
    roof: OpRoofline
    vllm_version: str | None = None
    context_source: Source = field(init=False)
    generation_source: Source = field(init=False)

    def __post_init__(self) -> None:
        self._donors: dict[str, OpRoofline] = {}
        self._table_window: bool = False
        self._ctx, self._ctx_scale, self.context_source = self._resolve("context_attention_perf", tables.context_attention_tables)
        self._gen, self._gen_scale, self.generation_source = self._resolve(
            "generation_attention_perf", tables.generation_attention_tables
        )

    def _resolve(self, name: str, load: Callable[[TableRef], tables.ShapeGrids]) -> tuple[tables.GridTable | None, float, Source]:
        """This GPU's measured grid for the shape; else a donor GPU's (`DONOR_GPUS`), recorded in
        `_donors[name]` so queries scale it by the two GPUs' roofline ratio; else the roofline."""
        table, scale, source = self._resolve_on(self.gpu_key, name, load)
        if table is not None:
            return table, scale, source
        own_window = self._table_window
        for donor_key in DONOR_GPUS:
            if donor_key == self.gpu_key:
                continue
            donor_table, donor_scale, donor_source = self._resolve_on(donor_key, name, load)
            if donor_table is not None:
                self._donors[name] = OpRoofline(get_gpu(donor_key), self.roof.efficiency)
                note = "; ".join(
                    filter(
                        None,
                        [
                            f"{source.note} on this GPU: {donor_key}'s measurement × this GPU's roofline / {donor_key}'s",
                            donor_source.note,
                        ],
                    )
                )
                return donor_table, donor_scale, Source(f"{donor_source.label} (transferred)", note)
        self._table_window = own_window
        return None, 1.0, source

    def _resolve_on(
        self, gpu_key: str, name: str, load: Callable[[TableRef], tables.ShapeGrids]
    ) -> tuple[tables.GridTable | None, float, Source]:
        ref: TableRef | None = locate_table(gpu_key, "attention", name, self.vllm_version)
        if ref is None:
            self._table_window = False
            return None, 1.0, Source(ROOFLINE, "no measured attention table for this GPU")
        grids = load(ref)
        keys = list(grids)
        window = self.shape.window or 0
        found = _nearest_key(keys, self.shape, window) if window else None
        self._table_window = bool(found)
        if found is None:
            found = _nearest_key(keys, self.shape, 0)
        if found is None:
            return (
                None,
                1.0,
                Source(
                    ROOFLINE,
                    f"no measured shape {self.shape.q_heads}/{self.shape.kv_heads} heads × "
                    f"{self.shape.head_dim}, KV {self.shape.kv_dtype}",
                ),
            )
        key, scale = found
        note = "" if scale == 1.0 else f"nearest measured heads {key[0]}/{key[1]} scaled ×{scale:.3g}"
        if window and not self._table_window:
            note = "; ".join(filter(None, [note, f"window {window} priced as full attention over the kept context"]))
        q, kv, dim, kv_dtype, win = key
        shape = f"{q}/{kv} heads × {dim}, KV {kv_dtype}" + (f", window {win}" if win else "")
        return grids[key], scale, Source(f"{ref.label}, {shape}", note)

    def _roof_ctx(self, batch: float, length: float, roof: OpRoofline | None = None) -> float:
        s = self.shape
        return (roof or self.roof).context_attention_s(batch, length, s.q_heads, s.kv_heads, s.head_dim, s.kv_bytes)

    def _roof_gen(self, batch: float, context: float, roof: OpRoofline | None = None) -> float:
        s = self.shape
        return (roof or self.roof).generation_attention_s(batch, context, s.q_heads, s.kv_heads, s.head_dim, s.kv_bytes)

    def _window_cap(self, length: float) -> float:
        window = self.shape.window
        return min(length, float(window)) if window and not self._table_window else length

    def _full_prefill_s(self, batch: float, length: float) -> float:
        """F(length): `batch` causal prefills from empty; past an unmeasured window, each query costs the window's."""
        if length <= 0:
            return 0.0
        window = self.shape.window if not self._table_window else None
        if window and length > window:
            at_window = self._full_prefill_s(batch, float(window))
            return at_window + (length - window) * 2.0 * at_window / window
        if self._ctx is None:
            return self._roof_ctx(batch, length)
        donor = self._donors.get("context_attention_perf")
        value, beyond = self._ctx.latency_ms(batch, length, lambda b, n: self._roof_ctx(b, n, donor))
        self.context_source.extrapolated |= beyond
        if donor is not None:
            value *= self._roof_ctx(batch, length) / max(self._roof_ctx(batch, length, donor), 1e-15)
        return value * MS * self._ctx_scale

    def decode_s(self, batch: float, context: float) -> float:
        """`batch` decodes over `context` cached tokens each."""
        if batch <= 0:
            return 0.0
        context = max(self._window_cap(context), 1.0)
        if self._gen is None:
            return self._roof_gen(batch, context)
        donor = self._donors.get("generation_attention_perf")
        value, beyond = self._gen.latency_ms(batch, context, lambda b, n: self._roof_gen(b, n, donor))
        self.generation_source.extrapolated |= beyond
        if donor is not None:
            value *= self._roof_gen(batch, context) / max(self._roof_gen(batch, context, donor), 1e-15)
        return value * MS * self._gen_scale

    def prefill_s(self, seqs: float, chunk: float, end: float) -> float:
        """`seqs` prompt chunks of `chunk` tokens ending at context `end` (prior context end − chunk).

        max of: the causal-triangle difference F(end) − F(prior) (the work of the chunk's queries),
        F(chunk) (a fresh chunk of this size: launch and tile overheads), and a decode over `end`
        (the chunk reads at least the whole cached context once).
        """
        if seqs <= 0 or chunk <= 0:
            return 0.0
        prior = max(end - chunk, 0.0)
        fresh = self._full_prefill_s(seqs, chunk)
        if prior <= 0:
            return fresh
        triangle = self._full_prefill_s(seqs, end) - self._full_prefill_s(seqs, prior)
        return max(triangle, fresh, self.decode_s(seqs, end))


@dataclass
class MoePricer:
    """One MoE layer (router, grouped expert GEMMs, combine) from the moe table, else the roofline."""

    gpu_key: str
    weight: str
    hidden: int
    width: int
    top_k: int
    experts: int
    tp: int
    roof: OpRoofline
    roofline_layer_s: Callable[[float, OpRoofline], float]
    """The roofline seconds of one MoE layer for a token count on a GPU's roofline (the fallback, the
    extrapolation scale, and the scale from a donor GPU's measurement to this one)."""
    vllm_version: str | None = None
    ep: int = 1
    """Expert-parallel ranks (then `tp` is the MoE's own TP, 1)."""
    source: Source = field(init=False)

    def __post_init__(self) -> None:
        choice = moe_kernel(self.weight, bool(self.roof.gpu.fp8_tflops))
        self._slowdown = WEIGHT_ONLY_SLOWDOWN if choice.weight_only else 1.0
        self._curve: tables.Curve | None = None
        self._donor: OpRoofline | None = None
        ref = locate_table(self.gpu_key, "moe", "moe_perf", self.vllm_version)
        found = self._find(ref, choice)
        parallel = f"EP {self.ep}" if self.ep > 1 else f"TP {self.tp}"
        ep_note = "EP dispatch/combine traffic not priced" if self.ep > 1 else ""
        if found is not None:
            self._curve, label = found
            self.source = Source(label, "; ".join(filter(None, [choice.note, ep_note])))
            return
        why = choice.note or (
            "no measured MoE table for this GPU"
            if ref is None
            else f"shape hidden {self.hidden}, width {self.width}, top-{self.top_k} of {self.experts}, {parallel} not measured"
        )
        if choice.table_dtypes:
            for donor_key in DONOR_GPUS:
                if donor_key == self.gpu_key:
                    continue
                donor = self._find(locate_table(donor_key, "moe", "moe_perf", self.vllm_version), choice)
                if donor is not None:
                    self._curve, label = donor
                    self._donor = OpRoofline(get_gpu(donor_key), self.roof.efficiency)
                    note = (
                        f"{why} on this GPU: {donor_key}'s measurement × this GPU's roofline / {donor_key}'s at each token count"
                    )
                    self.source = Source(f"{label} (transferred)", "; ".join(filter(None, [note, choice.note, ep_note])))
                    return
        self.source = Source(ROOFLINE, why)

    def _find(self, ref: TableRef | None, choice: KernelChoice) -> tuple[tables.Curve, str] | None:
        """This layer's measured curve in one GPU's MoE table (the first table dtype that has the shape)."""
        if ref is None:
            return None
        curves = tables.moe_curves(ref)
        for dtype in choice.table_dtypes:
            key = (dtype, self.hidden, self.width, self.top_k, self.experts, self.tp, self.ep)
            if key in curves:
                parallel = f"EP {self.ep}" if self.ep > 1 else f"TP {self.tp}"
                return curves[key], (
                    f"{ref.label}, {dtype} hidden {self.hidden} width {self.width} top-{self.top_k}/{self.experts} {parallel}"
                )
        return None

    def seconds(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        own = self.roof

        def fallback(count: float) -> float:
            return self.roofline_layer_s(count, own)

        if self._curve is None:
            return fallback(tokens)
        measured_on = self._donor or own
        value, beyond = interp_curve(
            self._curve[0],
            self._curve[1],
            tokens,
            lambda a, b: self.roofline_layer_s(b, measured_on) / max(self.roofline_layer_s(a, measured_on), 1e-12),
        )
        self.source.extrapolated |= beyond
        if self._donor is not None:
            value *= fallback(tokens) / max(self.roofline_layer_s(tokens, self._donor), 1e-15)
        return value * MS * self._slowdown


CUSTOM_ALLREDUCE_PCIE_MAX_GPUS = 2
"""vLLM's custom all-reduce runs over PCIe only between two GPUs (P2P); beyond that it falls back to NCCL."""


@dataclass
class AllReducePricer:
    """Tensor-parallel all-reduce of bf16 activations, as vLLM runs it: its custom all-reduce
    (`custom_allreduce_perf`), or NCCL (`nccl_perf`) on PCIe GPUs past two; else the roofline."""

    gpu_key: str
    tp: int
    roof: OpRoofline
    vllm_version: str | None = None
    source: Source = field(init=False)

    def __post_init__(self) -> None:
        self._curve: tables.Curve | None = None
        pcie = self.roof.gpu.interconnect.lower().startswith("pcie")
        if pcie and self.tp > CUSTOM_ALLREDUCE_PCIE_MAX_GPUS:
            ref = locate_table(self.gpu_key, "comm", "nccl_perf", None, "nccl")
            curves = tables.nccl_allreduce_curves(ref) if ref is not None else {}
            note = f"NCCL: vLLM's custom all-reduce does not run over PCIe past {CUSTOM_ALLREDUCE_PCIE_MAX_GPUS} GPUs"
        else:
            ref = locate_table(self.gpu_key, "comm", "custom_allreduce_perf", self.vllm_version)
            curves = tables.allreduce_curves(ref) if ref is not None else {}
            note = ""
        curve = curves.get(self.tp)
        if ref is not None and curve is not None:
            self._curve = curve
            label = ref.label.replace(f"vLLM {ref.vllm_version}", f"NCCL {ref.vllm_version}") if note else ref.label
            self.source = Source(f"{label}, {self.tp} GPUs", note)
            return
        self.source = Source(
            ROOFLINE, "no measured all-reduce for this GPU" if ref is None else f"all-reduce over {self.tp} GPUs not measured"
        )

    def seconds(self, elements: float) -> float:
        """One all-reduce of `elements` bf16 values over the TP group."""
        if self.tp <= 1 or elements <= 0:
            return 0.0
        if self._curve is None:
            return self.roof.allreduce_s(elements, self.tp)
        value, beyond = interp_curve(self._curve[0], self._curve[1], elements, self._grow)
        self.source.extrapolated |= beyond
        return value * MS

    def _grow(self, start: float, end: float) -> float:
        return self.roof.allreduce_s(end, self.tp) / max(self.roof.allreduce_s(start, self.tp), 1e-12)


@dataclass
class EncoderAttentionPricer:
    """ViT attention from the encoder_attention table; heads and head size by the nearest-shape rule."""

    gpu_key: str
    heads: int
    head_dim: int
    roof: OpRoofline
    vllm_version: str | None = None
    source: Source = field(init=False)

    def __post_init__(self) -> None:
        self._grid: tables.GridTable | None = None
        self._scale = 1.0
        ref = locate_table(self.gpu_key, "encoder_attention", "encoder_attention_perf", self.vllm_version)
        if ref is None:
            self.source = Source(ROOFLINE, "no measured ViT attention for this GPU")
            return
        grids = tables.encoder_attention_tables(ref)
        if not grids:
            self.source = Source(ROOFLINE, "empty ViT attention table")
            return
        # Nearest head size first (work ∝ head_dim), then nearest heads (work ∝ heads).
        dims = sorted({key[1] for key in grids})
        dim = min(dims, key=lambda d: abs(math.log(d / self.head_dim)))
        heads = sorted({key[0] for key in grids if key[1] == dim})
        head = min(heads, key=lambda h: abs(math.log(h / self.heads)))
        self._grid = grids[(head, dim)]
        self._scale = (self.heads / head) * (self.head_dim / dim)
        note = "" if self._scale == 1.0 else f"nearest measured {head} heads × {dim} scaled ×{self._scale:.3g}"
        self.source = Source(f"{ref.label}, {head} heads × {dim}", note)

    def seconds(self, images: float, patches: float) -> float:
        if images <= 0 or patches <= 0:
            return 0.0
        if self._grid is None:
            return self.roof.encoder_attention_s(images, patches, self.heads, self.head_dim)
        value, beyond = self._grid.latency_ms(
            images, patches, lambda b, s: self.roof.encoder_attention_s(b, s, self.heads, self.head_dim)
        )
        self.source.extrapolated |= beyond
        return value * MS * self._scale
