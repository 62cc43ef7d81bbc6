"""Roofline time of single kernels: the fallback where no table measured an op, and the scale
for extrapolating beyond a table's range.

Each op takes the larger of its FLOPs at `compute` × peak and its bytes at `bandwidth` × peak
(the calibrated efficiencies of the roofline step cost), on one GPU of the tensor-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Efficiency
from vlmserve.hardware.gpus import GPU, allreduce_time_s
from vlmserve.hardware.kernels.quant import bytes_per_weight, weight_format

ACTIVATION_BYTES = 2.0
"""Activations are bf16."""


@dataclass(frozen=True)
class OpRoofline:
    """Per-kernel roofline on one GPU."""

    gpu: GPU
    efficiency: Efficiency

    @property
    def _bytes_per_s(self) -> float:
        return self.gpu.bandwidth_bytes_s * max(self.efficiency.bandwidth, 1e-6)

    def _flops_per_s(self, weight: str = "bf16") -> float:
        """The GPU's GEMM path for this format (`GPU.compute_path`: W8A8, W4A4 or weight-only) × `compute`."""
        try:
            peak = self.gpu.peak_flops(weight_format(weight))
        except UserError:
            peak = self.gpu.bf16_tflops * 1e12
        return peak * max(self.efficiency.compute, 1e-6)

    def time_s(self, flops: float, nbytes: float, weight: str = "bf16") -> float:
        return max(flops / self._flops_per_s(weight), nbytes / self._bytes_per_s)

    def gemm_s(self, m: float, n: float, k: float, weight: str = "bf16") -> float:
        """y[m,n] = x[m,k] · W[k,n]: 2mnk FLOPs; W once, x and y once each."""
        nbytes = n * k * bytes_per_weight(weight) + (m * k + m * n) * ACTIVATION_BYTES
        return self.time_s(2.0 * m * n * k, nbytes, weight)

    def context_attention_s(
        self, batch: float, length: float, q_heads: int, kv_heads: int, head_dim: int, kv_bytes: float
    ) -> float:
        """Causal prefill of `batch` prompts of `length`: ~length²/2 query-key pairs each."""
        pairs = batch * length * (length + 1) / 2.0
        flops = 4.0 * q_heads * head_dim * pairs
        nbytes = batch * length * head_dim * (2 * q_heads * ACTIVATION_BYTES + 2 * kv_heads * kv_bytes)
        return self.time_s(flops, nbytes)

    def generation_attention_s(
        self, batch: float, context: float, q_heads: int, kv_heads: int, head_dim: int, kv_bytes: float
    ) -> float:
        """One query per sequence over `context` cached tokens: reads the KV, 4·heads·d FLOPs per key."""
        flops = 4.0 * batch * q_heads * head_dim * context
        nbytes = batch * context * 2 * kv_heads * head_dim * kv_bytes
        return self.time_s(flops, nbytes)

    def encoder_attention_s(self, images: float, patches: float, heads: int, head_dim: int) -> float:
        """Bidirectional ViT attention: patches² pairs per image."""
        flops = 4.0 * heads * head_dim * images * patches * patches
        nbytes = 4.0 * images * patches * heads * head_dim * ACTIVATION_BYTES
        return self.time_s(flops, nbytes)

    def allreduce_s(self, elements: float, tp: int) -> float:
        """Ring all-reduce of bf16 elements over the GPU's link (calibrated link share and latency)."""
        return allreduce_time_s(
            elements * ACTIVATION_BYTES, tp, self.gpu, self.efficiency.interconnect, self.efficiency.allreduce_latency_s
        )

    def stream_s(self, nbytes: float) -> float:
        """Memory-bound elementwise work (norms, activations, residual adds)."""
        return nbytes / self._bytes_per_s
