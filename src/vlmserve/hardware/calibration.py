"""Achievable fractions of peak and fixed overheads: the planner's calibrated coefficients.

Datasheet peaks are never reached by a serving engine; how far below them vLLM runs
depends on the GPU, the kernels and the batch. These numbers are therefore data, not
constants in code: a `Calibration` holds defaults plus per-GPU overrides, loads and saves
as JSON, and `vlmserve plan calibrate` fits it from measured runs. The shipped default
(`hardware/data/calibration.json`) is fitted by benchmarks/plan_vs_published.py on the
calibration sources of the published reference only, so its errors on the validation sources
are held out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from vlmserve.errors import UserError
from vlmserve.hardware.jsonfile import read_json_file


@dataclass(frozen=True)
class Efficiency:
    """Coefficients for one GPU type. Defaults are the uncalibrated starting point."""

    bandwidth: float = 0.70
    """Fraction of peak memory bandwidth reached while streaming weights and KV (decode)."""
    compute: float = 0.40
    """Fraction of peak dense FLOP/s reached by prefill GEMMs and attention."""
    moe_efficiency: float = 1.0
    """Routed-expert kernels relative to dense ones, for both their FLOPs and their weight bytes
    (grouped GEMMs, often weight-only-quantized: MXFP4 on Hopper dequantizes in the kernel)."""
    step_overhead_s: float = 0.002
    """Fixed cost of one engine step: scheduling, input prep, kernel launches, sampling."""
    per_seq_overhead_s: float = 0.00002
    """Extra per sequence in the step (block tables, detokenizing, output processing)."""
    interconnect: float = 0.70
    """Fraction of the GPU-to-GPU link bandwidth an all-reduce reaches."""
    allreduce_latency_s: float = 0.00001
    """Latency of one all-reduce (2 per layer per step under tensor parallelism)."""
    moe_expert_spread: float = 1.0
    """Effective share of experts in play (1 = uniform routing; < 1 = skewed routing)."""
    request_overhead_s: float = 0.003
    """Per-request time outside the engine step loop (HTTP, tokenize, detokenize), added to TTFT."""
    reserved_memory_gb: float = 3.0
    """Per-GPU memory vLLM keeps for activations, CUDA graphs and the runtime (not KV)."""
    frontend_token_s: float = 0.0
    """CPU of vLLM's API server per output token it streams (the output processor's incremental
    detokenisation, the chat chunk's JSON, the SSE write). Since V1 the API server is its own
    process, so this work overlaps the engine's steps and bounds them only when it is the larger:
    with hundreds of streams at once (`hardware.cost.frontend_step_s`). 0: not priced."""
    frontend_request_s: float = 0.0
    """CPU of vLLM's API server per request it hands to the engine (HTTP body and validation, chat
    template, tokenisation, the engine hand-off), in the same process as `frontend_token_s`:
    under a burst of short requests the API server, not the GPU, sets the admission rate. 0: not priced."""

    def with_values(self, **values: float) -> "Efficiency":
        return replace(self, **values)


COEFFICIENTS: tuple[str, ...] = tuple(item.name for item in fields(Efficiency))


@dataclass
class Calibration:
    """Default coefficients plus per-GPU overrides, with a note on where they came from."""

    default: Efficiency = field(default_factory=Efficiency)
    per_gpu: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "uncalibrated defaults"
    fit_error: dict[str, float] = field(default_factory=dict)

    def for_gpu(self, gpu_key: str) -> Efficiency:
        """Coefficients for one GPU: the defaults with that GPU's overrides applied."""
        return self.default.with_values(**self.per_gpu.get(gpu_key, {}))

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "default": asdict(self.default), "per_gpu": self.per_gpu, "fit_error": self.fit_error}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Any, source: str) -> "Calibration":
        if not isinstance(data, dict):
            raise UserError(f"{source}: a calibration is a JSON object with 'default' and 'per_gpu'")
        default = _coefficients(data.get("default", {}), f"{source}: default")
        per_gpu_raw = data.get("per_gpu", {})
        if not isinstance(per_gpu_raw, dict):
            raise UserError(f"{source}: 'per_gpu' must map a GPU name to coefficients")
        per_gpu = {str(key).lower(): _coefficients(value, f"{source}: per_gpu.{key}") for key, value in per_gpu_raw.items()}
        return cls(Efficiency(**default), per_gpu, str(data.get("source", source)), dict(data.get("fit_error", {})))

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        data = read_json_file(path, "calibration file", "create one with `vlmserve plan calibrate`")
        return cls.from_dict(data, str(path))


def _coefficients(raw: Any, where: str) -> dict[str, float]:
    """Validate a {coefficient: number} mapping."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: must be an object of coefficients ({', '.join(COEFFICIENTS)})")
    checked: dict[str, float] = {}
    for key, value in raw.items():
        if key not in COEFFICIENTS:
            raise UserError(f"{where}: unknown coefficient '{key}'; known: {', '.join(COEFFICIENTS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"{where}: coefficient '{key}' must be a number ≥ 0, not {value!r}")
        checked[key] = float(value)
    return checked


def default_calibration() -> Calibration:
    """The shipped calibration, fitted on the calibration sources of benchmarks/data/published_vllm.csv only."""
    text = resources.files("vlmserve.hardware").joinpath("data/calibration.json").read_text()
    return Calibration.from_dict(json.loads(text), "built-in calibration")


def load_calibration(path: str | Path | None) -> Calibration:
    """The calibration at `path`, or the shipped default."""
    return Calibration.load(path) if path else default_calibration()
