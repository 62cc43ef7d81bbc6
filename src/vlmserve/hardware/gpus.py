"""The GPU catalog and what a model needs from it: memory, KV capacity, TP communication.

`data/hardware.csv` holds the project's reference table (/work/shared/reference/hardware.csv,
datasheet figures, dense, no sparsity) plus the Blackwell rows (B200, B300, GB200, with their
datasheet sources in `note`) and two columns the reference lacks: dense FP4 TFLOP/s
(Blackwell only) and `vllm_visible_gib`, the memory PyTorch reports for the device (what
vLLM multiplies by --gpu-memory-utilization: an "80 GB" H100 has 80 GiB of which the driver
keeps some back). It ships as package data so installed users have it. Where the datasheet
leaves a figure blank, the value the planner assumes is in `ASSUMED_FIGURES` below, with its
reasoning, and `vlmserve plan --explain` prints it.

How a weight format runs on a GPU follows vLLM (`compute_path`): FP8 as W8A8 on GPUs with FP8
tensor cores and weight-only (dequantized into BF16 GEMMs, Marlin) elsewhere; AWQ/GPTQ int4
and int8 weight-only everywhere; NVFP4 as W4A4 on Blackwell and weight-only elsewhere; MXFP4
as BF16 GEMMs. A weight-only path never prices faster than BF16 compute.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import normalize_dtype

GB = 1e9
GIB = float(2**30)

ASSUMED_FIGURES: dict[str, dict[str, float]] = {
    # GB10: only "1 PFLOP FP4 with sparsity" is published. Halving for dense and again per
    # precision step gives FP4 500, FP8 250 and BF16 125 dense TFLOP/s (the Blackwell ratios).
    "gb10": {"bf16_dense_tflops": 125.0, "fp8_dense_tflops": 250.0, "fp4_dense_tflops": 500.0}
}

WEIGHT_ONLY_COMPUTE_EFFICIENCY = 0.85
"""Weight-only GEMMs (Marlin and friends) dequantize every weight tile before the BF16 MMA: in
the compute-bound regime they reach about 85 % of a plain BF16 GEMM, so a weight-only format is
priced below BF16 peak — never above it (vLLM's own kernel benchmarks, large-M Marlin vs cuBLAS)."""

VISIBLE_MEMORY_SOURCES: dict[str, str] = {
    "h100": "79.18 GiB: published vLLM memory profiles on H100 ('H100 GPU (79.18 GiB)')",
    "h200": "139.81 GiB: vLLM 0.10.2 log 'Free memory on device (139.21/139.81 GiB) on startup'",
    "l40s": "44.42 GiB: vLLM log 'Free memory on device (43.93/44.42 GiB) on startup'",
    "a100": "79.15 GiB: PyTorch OOM text 'GPU 0 has a total capacity of 79.15 GiB'",
}
"""Where `vllm_visible_gib` comes from; the other rows are estimates (nominal GiB less the ~0.5 GiB
the driver keeps), and GB10's unified memory is what CUDA reports of the 128 GB LPDDR5x."""

VISIBLE_MEMORY_FRACTION = 0.99
"""Where the catalogue lacks `vllm_visible_gib`: the driver and ECC keep about 1 % of the nominal GiB."""


@dataclass(frozen=True)
class ComputePath:
    """How vLLM runs the GEMMs of one weight format on one GPU."""

    kind: str
    """'w16a16', 'w8a8-fp8', 'w4a4-nvfp4' or 'weight-only'."""
    flops: float
    """Dense FLOP/s the path can reach at peak."""
    note: str


@dataclass(frozen=True)
class GPU:
    """One GPU type's datasheet figures."""

    key: str
    """Short lowercase name used on the command line (h100, l40s, ...)."""
    name: str
    memory_gb: float
    memory_bandwidth_tb_s: float
    bf16_tflops: float
    fp8_tflops: float | None
    interconnect: str
    interconnect_gb_s: float
    note: str = ""
    fp4_tflops: float | None = None
    """Dense FP4 (NVFP4) TFLOP/s: Blackwell only."""
    visible_gib: float | None = None
    """Device memory as PyTorch (and so vLLM) reports it; None: VISIBLE_MEMORY_FRACTION of nominal."""

    @property
    def memory_bytes(self) -> float:
        """Nominal memory in bytes: HBM sizes are binary, an "80 GB" H100 has 80 GiB."""
        return self.memory_gb * GIB

    @property
    def visible_memory_bytes(self) -> float:
        """What vLLM's `total_memory` is on this GPU (torch.cuda.mem_get_info's total)."""
        if self.visible_gib:
            return self.visible_gib * GIB
        return self.memory_bytes * VISIBLE_MEMORY_FRACTION

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_tb_s * 1e12

    @property
    def link_bytes_s_per_direction(self) -> float:
        """GPU-to-GPU bytes/s one way. Datasheet link figures count both directions together
        (NVLink 4: 900 GB/s = 450 each way; PCIe 4 x16: 64 GB/s = 32 each way), while a ring
        all-reduce step sends and receives at once, each at the one-way rate."""
        return self.interconnect_gb_s * 1e9 / 2.0

    def compute_path(self, weight_dtype: str) -> ComputePath:
        """The GEMM path vLLM takes for weights of this format on this GPU (see the module doc)."""
        dtype = normalize_dtype(weight_dtype, "weight dtype")
        bf16 = self.bf16_tflops * 1e12
        weight_only = bf16 * WEIGHT_ONLY_COMPUTE_EFFICIENCY
        if dtype in ("bf16", "fp16"):
            return ComputePath("w16a16", bf16, "BF16 tensor cores")
        if dtype == "fp8":
            if self.fp8_tflops:
                return ComputePath("w8a8-fp8", self.fp8_tflops * 1e12, "FP8 W8A8 on FP8 tensor cores")
            return ComputePath(
                "weight-only",
                weight_only,
                f"{self.name} has no FP8 tensor cores: FP8 weights dequantized into BF16 GEMMs (Marlin)",
            )
        if dtype == "nvfp4":
            if self.fp4_tflops:
                return ComputePath("w4a4-nvfp4", self.fp4_tflops * 1e12, "NVFP4 W4A4 on Blackwell FP4 tensor cores")
            return ComputePath(
                "weight-only", weight_only, f"{self.name} has no FP4 tensor cores: NVFP4 weights run weight-only (Marlin W4A16)"
            )
        if dtype == "mxfp4":
            return ComputePath("weight-only", bf16, "MXFP4 experts dequantized in the MoE kernel into BF16 math (as calibrated)")
        return ComputePath(
            "weight-only", weight_only, f"{dtype} AWQ/GPTQ weights run weight-only (Marlin W{4 if dtype == 'int4' else 8}A16)"
        )

    def peak_flops(self, weight_dtype: str) -> float:
        """Dense FLOP/s for matmuls on weights of this format (`compute_path`)."""
        return self.compute_path(weight_dtype).flops


def _number(text: str) -> float | None:
    match = re.match(r"\s*([0-9]*\.?[0-9]+)", text or "")
    return float(match.group(1)) if match else None


def _key(name: str) -> str:
    """'H100 SXM' → 'h100', 'GB10 (DGX Spark)' → 'gb10'."""
    return name.split()[0].lower()


@cache
def catalog() -> dict[str, GPU]:
    """Every GPU in the shipped table, by short key."""
    text = resources.files("vlmserve.hardware").joinpath("data/hardware.csv").read_text()
    gpus: dict[str, GPU] = {}
    for row in csv.DictReader(text.splitlines()):
        key = _key(row["gpu"])
        assumed = ASSUMED_FIGURES.get(key, {})
        bf16 = _number(row["bf16_dense_tflops"]) or assumed.get("bf16_dense_tflops")
        fp8 = _number(row["fp8_dense_tflops"]) or assumed.get("fp8_dense_tflops")
        fp4 = _number(row.get("fp4_dense_tflops") or "") or assumed.get("fp4_dense_tflops")
        if bf16 is None:
            continue
        gpus[key] = GPU(
            key=key,
            name=row["gpu"],
            memory_gb=_number(row["memory_gb"]) or 0.0,
            memory_bandwidth_tb_s=_number(row["memory_bandwidth_tb_s"]) or 0.0,
            bf16_tflops=bf16,
            fp8_tflops=fp8,
            interconnect=row["interconnect"],
            interconnect_gb_s=_number(row["interconnect_gb_s"]) or 0.0,
            note=row.get("note", ""),
            fp4_tflops=fp4,
            visible_gib=_number(row.get("vllm_visible_gib") or ""),
        )
    return gpus


def get_gpu(name: str) -> GPU:
    """Look a GPU up by short key or full name, case-insensitively."""
    wanted = name.strip().lower()
    gpus = catalog()
    for gpu in gpus.values():
        aliases = {gpu.key, gpu.name.lower(), gpu.name.lower().replace(" ", "-"), gpu.name.lower().replace(" ", "")}
        if wanted in aliases:
            return gpu
    if wanted in ("spark", "dgx-spark", "dgx spark"):
        return gpus["gb10"]
    raise UserError(f"unknown GPU '{name}'; known GPUs: {', '.join(sorted(gpus))}")


def allreduce_time_s(message_bytes: float, tp: int, gpu: GPU, link_efficiency: float, latency_s: float) -> float:
    """Ring all-reduce: each GPU sends (and receives) 2·(tp−1)/tp · bytes over its link, plus a fixed latency."""
    if tp <= 1 or message_bytes <= 0:
        return 0.0
    link_bytes_s = gpu.link_bytes_s_per_direction * max(link_efficiency, 1e-6)
    return latency_s + 2.0 * (tp - 1) / tp * message_bytes / link_bytes_s
