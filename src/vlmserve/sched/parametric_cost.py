"""A parametric step-cost model with named profiles, for the simulated engine.

Step time = fixed overhead
          + per prefill token  × prompt tokens computed this step
          + per decode sequence × sequences decoding this step
          + per KV token read  × context tokens attention reads
          + per image token    × vision tokens encoded this step

This is the linear shape of a transformer step: the fixed term is mostly reading the
weights once (plus launch/scheduling overhead), the token terms are the matmul FLOPs,
and the KV term is attention's memory traffic. It is a rough model meant to make
queueing, saturation and preemption *emerge* in the right shape; the planner uses a
roofline model of a real model on a real GPU instead (same StepCostModel protocol).

How the profile numbers were set (hand-derived from datasheets in
/work/shared/reference/hardware.csv, not calibrated against measurements):
- `fixed_s` ≈ weight bytes / (60–70 % of memory bandwidth) + ~1 ms overhead.
- `per_prefill_token_s` ≈ 2 × active params FLOP / (≈40 % of dense BF16 FLOP/s).
- `per_decode_seq_s` ≈ the same FLOPs per token (a decode token is a 1-token prefill)
  plus ~20 µs of sampling/bookkeeping.
- `per_kv_token_s` ≈ KV bytes per token / (60–70 % of memory bandwidth);
  Llama-3.1-8B holds 2 × 32 × 8 × 128 × 2 B = 128 KiB per token in BF16.
- `per_image_token_s` ≈ a vision tower of ~0.4 B params at the same efficiency.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vlmserve.errors import UserError
from vlmserve.sched.step_cost import StepContents


@dataclass(frozen=True)
class ParametricStepCost:
    """Linear step-time model; see the module docstring for what each term stands for."""

    fixed_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_kv_token_s: float
    per_image_token_s: float = 0.0
    description: str = ""

    def step_time_s(self, step: StepContents) -> float:
        return (
            self.fixed_s
            + self.per_prefill_token_s * step.prefill_tokens
            + self.per_decode_seq_s * step.decode_seqs
            + self.per_kv_token_s * step.kv_tokens_read
            + self.per_image_token_s * step.image_tokens
        )

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


PROFILES: dict[str, ParametricStepCost] = {
    "tiny-cpu": ParametricStepCost(
        fixed_s=0.002,
        per_prefill_token_s=20e-6,
        per_decode_seq_s=0.25e-3,
        per_kv_token_s=0.05e-6,
        per_image_token_s=5e-6,
        description="a small VLM on a few CPU cores: cheap, fast steps for tests and demos",
    ),
    "a10g-8b": ParametricStepCost(
        fixed_s=0.028,  # 16 GB of BF16 weights at ~70 % of 600 GB/s + 1 ms
        per_prefill_token_s=0.32e-3,  # 16 GFLOP/token at ~40 % of 125 TFLOP/s
        per_decode_seq_s=0.34e-3,
        per_kv_token_s=0.31e-6,  # 128 KiB/token at ~70 % of 600 GB/s
        per_image_token_s=0.02e-3,
        description="Llama-3.1-8B-class model in BF16 on one A10G (24 GB)",
    ),
    "l40s-8b": ParametricStepCost(
        fixed_s=0.028,  # 16 GB at ~70 % of 864 GB/s + 1 ms
        per_prefill_token_s=0.11e-3,  # 16 GFLOP at ~40 % of 362 TFLOP/s
        per_decode_seq_s=0.13e-3,
        per_kv_token_s=0.22e-6,
        per_image_token_s=0.007e-3,
        description="Llama-3.1-8B-class model in BF16 on one L40S (48 GB)",
    ),
    "a100-8b": ParametricStepCost(
        fixed_s=0.0125,  # 16 GB at ~70 % of 2.04 TB/s + 1 ms
        per_prefill_token_s=0.128e-3,  # 16 GFLOP at ~40 % of 312 TFLOP/s
        per_decode_seq_s=0.15e-3,
        per_kv_token_s=0.092e-6,
        per_image_token_s=0.008e-3,
        description="Llama-3.1-8B-class model in BF16 on one A100 80GB",
    ),
    "h100-8b": ParametricStepCost(
        fixed_s=0.0082,  # 16 GB at ~70 % of 3.35 TB/s + 1 ms
        per_prefill_token_s=0.040e-3,  # 16 GFLOP at ~40 % of 989 TFLOP/s
        per_decode_seq_s=0.060e-3,
        per_kv_token_s=0.056e-6,
        per_image_token_s=0.0025e-3,
        description="Llama-3.1-8B-class model in BF16 on one H100 SXM",
    ),
    "h200-8b": ParametricStepCost(
        fixed_s=0.0058,  # 16 GB at ~70 % of 4.8 TB/s + 1 ms
        per_prefill_token_s=0.040e-3,
        per_decode_seq_s=0.060e-3,
        per_kv_token_s=0.039e-6,
        per_image_token_s=0.0025e-3,
        description="Llama-3.1-8B-class model in BF16 on one H200 SXM",
    ),
    "h100-qwen3vl-4b": ParametricStepCost(
        fixed_s=0.0045,  # ~8 GB at ~70 % of 3.35 TB/s + 1 ms
        per_prefill_token_s=0.020e-3,  # 8 GFLOP at ~40 % of 989 TFLOP/s
        per_decode_seq_s=0.040e-3,
        per_kv_token_s=0.062e-6,  # 2 × 36 × 8 × 128 × 2 B = 144 KiB/token
        per_image_token_s=0.002e-3,
        description="Qwen3-VL-4B-class VLM in BF16 on one H100 SXM",
    ),
}

DEFAULT_PROFILE = "tiny-cpu"


def get_profile(name: str) -> ParametricStepCost:
    """The named profile, or a UserError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise UserError(f"unknown sim profile '{name}'; choose one of: {known}") from None
