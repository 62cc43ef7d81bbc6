"""The GPU catalog and what a model needs from it: memory, KV capacity, TP communication.

`data/hardware.csv` is a verbatim copy of the project's reference table
(/work/shared/reference/hardware.csv, datasheet figures, dense, no sparsity); it ships as
package data so installed users have it. Where the datasheet leaves a figure blank, the
value the planner assumes is in `ASSUMED_FIGURES` below, with its reasoning, and
`vlmserve plan --explain` prints it.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from vlmserve.errors import UserError
from vlmserve.hardware.dtypes import normalize_dtype
from vlmserve.hardware.models import ModelCost

GB = 1e9

ASSUMED_FIGURES: dict[str, dict[str, float]] = {
    # GB10: only "1 PFLOP FP4 with sparsity" is published. Halving for dense and again per
    # precision step gives FP8 250 and BF16 125 dense TFLOP/s (the Blackwell ratios).
    "gb10": {"bf16_dense_tflops": 125.0, "fp8_dense_tflops": 250.0},
}


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

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_tb_s * 1e12

    @property
    def link_bytes_s_per_direction(self) -> float:
        """GPU-to-GPU bytes/s one way. Datasheet link figures count both directions together
        (NVLink 4: 900 GB/s = 450 each way; PCIe 4 x16: 64 GB/s = 32 each way), while a ring
        all-reduce step sends and receives at once, each at the one-way rate."""
        return self.interconnect_gb_s * 1e9 / 2.0

    def peak_flops(self, weight_dtype: str) -> float:
        """Dense FLOP/s for matmuls on weights of this format.

        FP8 weights run FP8 GEMMs where the GPU has them. MXFP4 and FP8-without-support
        are dequantized and multiplied in BF16 (vLLM's weight-only paths on Hopper/Ampere).
        """
        if normalize_dtype(weight_dtype, "weight dtype") == "fp8" and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


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


@dataclass(frozen=True)
class MemoryPlan:
    """How one replica's memory splits into weights, reserve and KV cache."""

    weight_bytes_per_gpu: float
    reserved_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    kv_bytes_total: float
    """KV cache bytes across the replica's GPUs."""

    @property
    def kv_gb_total(self) -> float:
        return self.kv_bytes_total / GB


def plan_memory(
    model: ModelCost,
    gpu: GPU,
    tp: int,
    *,
    weight_dtype: str,
    gpu_memory_utilization: float,
    reserved_gb: float,
) -> MemoryPlan:
    """KV capacity = memory × utilization − weights − reserve, per GPU, times TP.

    Raises a UserError that says how many GB are missing when the weights do not fit.
    """
    if tp < 1:
        raise UserError("--tp must be at least 1")
    if model.attention and model.attention[0].q_heads % tp != 0:
        raise UserError(
            f"{model.name} has {model.attention[0].q_heads} attention heads, which {tp} GPUs cannot split evenly; "
            "pick a TP that divides it"
        )
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise UserError("--gpu-memory-utilization must be in (0, 1]")
    weights_per_gpu = model.weight_bytes(weight_dtype) / tp
    usable = gpu.memory_bytes * gpu_memory_utilization
    reserved = reserved_gb * GB
    kv_per_gpu = usable - weights_per_gpu - reserved
    if kv_per_gpu <= 0:
        missing_gb = -kv_per_gpu * tp / GB
        raise UserError(
            f"{model.name} ({weight_dtype}) does not fit on {tp}× {gpu.name}: weights need "
            f"{weights_per_gpu / GB:.1f} GB per GPU, {gpu_memory_utilization:.2f} of {gpu.memory_gb:g} GB leaves "
            f"{usable / GB:.1f} GB with {reserved_gb:g} GB reserved; {missing_gb:.1f} GB missing in all — "
            "raise --tp, pick a larger GPU or a smaller weight dtype"
        )
    return MemoryPlan(weights_per_gpu, reserved, usable, kv_per_gpu * tp)


def allreduce_time_s(message_bytes: float, tp: int, gpu: GPU, link_efficiency: float, latency_s: float) -> float:
    """Ring all-reduce: each GPU sends (and receives) 2·(tp−1)/tp · bytes over its link, plus a fixed latency."""
    if tp <= 1 or message_bytes <= 0:
        return 0.0
    link_bytes_s = gpu.link_bytes_s_per_direction * max(link_efficiency, 1e-6)
    return latency_s + 2.0 * (tp - 1) / tp * message_bytes / link_bytes_s
