"""Quantisation as vLLM runs it: which measured GEMM/MoE kernel a weight format uses on a GPU.

- bf16/fp16: the bf16 tensor-core GEMM (`torch.nn.functional.linear`).
- fp8 on a GPU with FP8 tensor cores: W8A8 (GEMMs: per-tensor `fp8` table, else block-scaled `fp8_block`;
  routed experts: block-scaled first, as the published FP8 MoE checkpoints are — see MOE_TABLE_DTYPES).
- fp8 on a GPU without them (A100): vLLM runs FP8 checkpoints weight-only (Marlin W8A16): the
  weights are dequantised in the kernel's main loop and multiplied in bf16. Priced as the measured
  bf16 kernel divided by the catalogue's weight-only efficiency, so it never comes out faster than bf16.
- nvfp4: the measured `nvfp4` kernel where the GPU has FP4 tensor cores (Blackwell tables).
- int4/int8 (AWQ/GPTQ, W4A16/W8A16 Marlin), nvfp4 without FP4 tensor cores and mxfp4 dense layers:
  no measured GEMM table. The measured bf16 kernel of the same shape is scaled by the roofline's
  ratio between the two formats (fewer weight bytes where memory-bound, the catalogue's weight-only
  compute path where compute-bound), labelled as such.

Weight format names are the project's (`hardware.dtypes`: bf16, fp16, fp8, int8, int4, nvfp4, mxfp4).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import normalize_dtype, weight_bytes_per_param
from vlmserve.hardware.gpus import WEIGHT_ONLY_COMPUTE_EFFICIENCY

WEIGHT_ONLY_SLOWDOWN = 1.0 / WEIGHT_ONLY_COMPUTE_EFFICIENCY
"""Weight-only kernels (Marlin W8A16/W4A16) relative to the bf16 GEMM of the same shape on the same
GPU: the catalogue's weight-only efficiency (`gpus.WEIGHT_ONLY_COMPUTE_EFFICIENCY`), applied to the
measured bf16 latency. No measured weight-only GEMM table exists; ≥ 1 keeps FP8 on an A100 from
pricing faster than bf16, which is what vLLM users see."""


def weight_format(name: str) -> str:
    """The project's canonical weight format name (`dtypes.normalize_dtype`), or the name as given
    when it does not know it (the caller then finds no table and prices on the roofline, saying so)."""
    try:
        return normalize_dtype(name, "weight dtype")
    except UserError:
        return name.strip().lower()


def bytes_per_weight(name: str) -> float:
    """Storage per weight (`dtypes.weight_bytes_per_param`, default group size); 2 for an unknown format."""
    try:
        return weight_bytes_per_param(name)
    except UserError:
        return 2.0


@dataclass(frozen=True)
class KernelChoice:
    """Which measured table prices a GEMM of this weight format, and how."""

    table_dtypes: tuple[str, ...]
    """Measured `gemm_dtype` values to try, in order (empty: the roofline)."""
    weight_only: bool = False
    """Dequantised into the bf16 kernel (priced as bf16 × WEIGHT_ONLY_SLOWDOWN)."""
    roofline_scaled: bool = False
    """No table of its own: the bf16 kernel × roofline(format) / roofline(bf16) at the same shape."""
    note: str = ""


def gemm_kernel(weight: str, gpu_has_fp8: bool, gpu_has_fp4: bool) -> KernelChoice:
    """How vLLM multiplies by weights of this format on this GPU."""
    fmt = weight_format(weight)
    if fmt in ("bf16", "fp16"):
        return KernelChoice(("bfloat16",))
    if fmt == "fp8":
        if gpu_has_fp8:
            return KernelChoice(("fp8", "fp8_block"), note="W8A8 FP8")
        return KernelChoice(
            ("bfloat16",),
            weight_only=True,
            note=f"FP8 weight-only (W8A16) on a GPU without FP8 tensor cores: bf16 kernel × {WEIGHT_ONLY_SLOWDOWN:.3g}",
        )
    if fmt == "nvfp4" and gpu_has_fp4:
        return KernelChoice(("nvfp4",), note="NVFP4 W4A4")
    if fmt in ("nvfp4", "int4", "int8", "mxfp4"):
        return KernelChoice(
            ("bfloat16",),
            roofline_scaled=True,
            note=f"{fmt} weight-only GEMM: no measured table; the bf16 kernel × the roofline's {fmt}/bf16 ratio",
        )
    return KernelChoice((), note=f"weight format {weight!r}: no measured table")


MOE_TABLE_DTYPES: dict[str, tuple[str, ...]] = {
    "bf16": ("bfloat16",),
    "fp16": ("bfloat16",),
    # Block-scaled first: the FP8 MoE checkpoints that model makers publish (Qwen3-*-FP8, DeepSeek-V3/R1,
    # GLM-4.x-FP8) carry 128×128 weight blocks ("weight_block_size" in their quantization_config), which
    # vLLM runs through its block-FP8 fused-MoE kernels. The per-tensor rows are what `--quantization fp8`
    # makes of a BF16 checkpoint; on H100 they measure 3–5× slower than the block rows at decode sizes.
    "fp8": ("fp8_block", "fp8"),
    "mxfp4": ("w4a16_mxfp4",),
    "int4": ("int4_wo",),
    "nvfp4": ("nvfp4",),
}
"""Measured `moe_dtype` values for each weight format (FP8 only where the GPU has FP8; see moe_kernel)."""


def moe_kernel(weight: str, gpu_has_fp8: bool) -> KernelChoice:
    """How vLLM runs routed experts of this format: same rules as GEMMs, on the MoE table."""
    fmt = weight_format(weight)
    if fmt == "fp8" and not gpu_has_fp8:
        return KernelChoice(
            ("bfloat16",), weight_only=True, note=f"FP8 experts weight-only: bf16 kernel × {WEIGHT_ONLY_SLOWDOWN:.3g}"
        )
    dtypes = MOE_TABLE_DTYPES.get(fmt, ())
    return KernelChoice(dtypes, note="" if dtypes else f"{fmt} experts: no measured table")
