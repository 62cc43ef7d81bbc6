"""A deployment to plan: model × GPU × TP × replicas × engine limits, and what follows from it.

`PlanSetup` turns the user's choices into the two things the shared scheduler needs — a
`SchedulerConfig` (with the KV block count the memory left after weights allows) and a step
cost model — and fails early, in one line, when the model does not fit.

The step cost model (`--cost-model`): `kernels` sums measured vLLM kernel latencies
(`hardware.kernels.MeasuredStepCost`, from the optional `aiconfigurator-core` tables), `roofline`
is the calibrated roofline (`RooflineStepCost`), and `auto` (the default) takes the kernels where
the tables cover the GPU's GEMMs and attention, else the roofline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration, Efficiency, default_calibration
from vlmserve.hardware.cost import RooflineStepCost
from vlmserve.hardware.dtypes import normalize_dtype, normalize_kv_dtype
from vlmserve.hardware.gpus import GIB, GPU, get_gpu
from vlmserve.hardware.kernels.locate import covers, data_root
from vlmserve.hardware.kernels.vision_shape import VisionShape, raw_config_or_none, vision_shape
from vlmserve.hardware.memory import MemoryPlan, VllmStartupReport, kv_capacity_tokens, plan_memory, vllm_startup_report
from vlmserve.hardware.models import ModelCost, load_model
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.sched.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from vlmserve.hardware.kernels.step_cost import MeasuredStepCost

FRONTEND_PER_IMAGE_MS = 15.0
FRONTEND_PER_MEGAPIXEL_MS = 18.0
"""Priors for vLLM's frontend work on an image not in its cache (decode, resize, processor): fitted
to the TTFT saved by a cache hit on the embedded Idefics3 model, one API server on one core of this
project's 2-core machine (benchmarks/image_preprocess_cost.py, docs/benchmarks.md). A server CPU and
another family's processor differ: override with --mm-preprocess-ms-per-image/-per-megapixel."""

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM's own default since 0.21 (CacheConfig.gpu_memory_utilization; 0.9 before)."""
DEFAULT_BLOCK_SIZE = 16

COST_MODELS = ("auto", "kernels", "roofline")
"""`--cost-model` choices; see the module docstring."""
DEFAULT_COST_MODEL = "auto"


def vllm_default_limits(gpu: GPU) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's OpenAI server picks when not told.

    vLLM (`EngineArgs.get_batch_defaults`) gives GPUs with at least 70 GiB that are not
    A100s 1024 sequences and 8192 tokens per step, everything else 256 and 2048.
    """
    if gpu.visible_memory_bytes >= 70 * GIB and gpu.key != "a100":
        return 1024, 8192
    return 256, 2048


@dataclass
class PlanSetup:
    """One deployment as the planner models it."""

    model: ModelCost
    gpu: GPU
    tp: int = 1
    replicas: int = 1
    ep: int | None = None
    """Expert-parallel GPUs per replica (vLLM --enable-expert-parallel with DP = ep ÷ tp); None: experts split by TP."""
    weight_dtype: str | None = None
    """None → the checkpoint's own format (e.g. MXFP4 for gpt-oss)."""
    kv_dtype: str = "bf16"
    calibration: Calibration = field(default_factory=default_calibration)
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_num_seqs: int | None = None
    """None → vLLM's default for this GPU (see `vllm_default_limits`)."""
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    routing: str = LEAST_OUTSTANDING_TOKENS
    async_scheduling: bool = False
    """vLLM's --async-scheduling: the CPU work of a step overlaps the GPU's previous step."""
    frontend: FrontendConfig = field(
        default_factory=lambda: FrontendConfig(per_image_ms=FRONTEND_PER_IMAGE_MS, per_megapixel_ms=FRONTEND_PER_MEGAPIXEL_MS)
    )
    """vLLM's API servers preprocessing images (sched.frontend); the costs are priors, see below."""
    cost_model_kind: str = DEFAULT_COST_MODEL
    """auto | kernels | roofline (`--cost-model`)."""
    vllm_version: str | None = None
    """The deployment's vLLM version: the kernel tables closest to it are used (None → the newest)."""
    vision_shape: VisionShape | None = None
    """The ViT's widths, depth and heads from the vision config (measured kernels price the encoder from them)."""
    _cost: tuple[tuple[Any, ...], RooflineStepCost | MeasuredStepCost] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """The cost model built last, with the inputs it was built from (one instance per setup, so its
    per-shape caches and its record of extrapolations outlive one simulation for `--explain`)."""

    def __post_init__(self) -> None:
        self.weight_dtype = normalize_dtype(self.weight_dtype or self.model.default_weight_dtype, "--weight-dtype")
        self.kv_dtype = normalize_kv_dtype(self.kv_dtype, "--kv-dtype")
        if self.replicas < 1:
            raise UserError("--replicas must be at least 1")
        for problem in self.frontend.validate():
            raise UserError(problem)
        default_seqs, default_tokens = vllm_default_limits(self.gpu)
        self.max_num_seqs = self.max_num_seqs or default_seqs
        self.max_num_batched_tokens = self.max_num_batched_tokens or default_tokens
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise UserError("--max-num-seqs and --max-num-batched-tokens must be at least 1")
        if self.cost_model_kind not in COST_MODELS:
            raise UserError(f"--cost-model '{self.cost_model_kind}' is not known; use one of: {', '.join(COST_MODELS)}")
        if self.cost_model_kind == "kernels" and not covers(self.gpu.key):
            raise UserError(f"--cost-model kernels: {self._why_no_tables()}; use --cost-model roofline or auto")
        if self.vllm_version is not None and not re.fullmatch(r"\d+(\.\d+){0,2}([.+-][0-9A-Za-z]+)*", self.vllm_version):
            raise UserError(f"--vllm-version '{self.vllm_version[:40]}' is not a version like 0.11.0")
        if self.vision_shape is None and self.model.vision is not None:
            config = raw_config_or_none(self.model.name)
            self.vision_shape = vision_shape(config) if config else None

    @classmethod
    def from_names(cls, model: str, gpu: str, **options: Any) -> "PlanSetup":
        cost = load_model(model)
        if cost.vision is not None and "vision_shape" not in options:
            config = raw_config_or_none(model)
            options["vision_shape"] = vision_shape(config) if config else None
        return cls(model=cost, gpu=get_gpu(gpu), **options)

    def _why_no_tables(self) -> str:
        if data_root() is None:
            return "the measured kernel tables are not installed (pip install 'vlmserve[plan]')"
        return f"the measured kernel tables do not cover {self.gpu.name} (GEMMs and attention for vLLM)"

    @property
    def uses_kernels(self) -> bool:
        """Whether steps are priced from measured kernels (else the roofline)."""
        return self.cost_model_kind == "kernels" or (self.cost_model_kind == "auto" and covers(self.gpu.key))

    def cost_model_summary(self) -> str:
        """One line: which step cost model prices this deployment, and why."""
        if self.uses_kernels:
            return "measured vLLM kernels (aiconfigurator-core tables), roofline where they stop"
        if self.cost_model_kind == "roofline":
            return "roofline (--cost-model roofline)"
        return f"roofline: {self._why_no_tables()}"

    @property
    def efficiency(self) -> Efficiency:
        return self.calibration.for_gpu(self.gpu.key)

    @property
    def num_gpus(self) -> int:
        return (self.ep or self.tp) * self.replicas

    def memory(self) -> MemoryPlan:
        """Per-GPU split as vLLM's profiling run makes it (hardware.memory)."""
        assert self.weight_dtype is not None
        return plan_memory(
            self.model,
            self.gpu,
            self.tp,
            weight_dtype=self.weight_dtype,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_batched_tokens=self.max_num_batched_tokens or 1,
            max_num_seqs=self.max_num_seqs or 1,
            ep=self.ep,
        )

    def kv_capacity_tokens(self, typical_context: int) -> int:
        """Tokens the KV cache holds when sequences are about `typical_context` long.

        Sliding-window layers keep at most their window, so bytes per token depend on
        context length; pricing at the workload's typical length turns the hybrid cache
        into the single block pool the scheduler models.
        """
        return kv_capacity_tokens(self.model, self.memory(), self.tp, self.kv_dtype, typical_context, DEFAULT_BLOCK_SIZE)

    def vllm_startup_report(self, max_model_len: int) -> VllmStartupReport:
        """The "GPU KV cache size" and "Maximum concurrency" lines vLLM would print for this replica,
        so a user can hold the plan against the engine's own start-up log."""
        memory = self.memory()
        return vllm_startup_report(self.model, memory.kv_bytes_per_gpu, self.tp, self.kv_dtype, max_model_len)

    def scheduler_config(self, typical_context: int, longest_request: int) -> SchedulerConfig:
        """Engine limits for one replica, failing in one line when the KV cache is too small."""
        num_blocks = max(self.kv_capacity_tokens(typical_context) // DEFAULT_BLOCK_SIZE, 1)
        capacity = num_blocks * DEFAULT_BLOCK_SIZE
        max_model_len = self.max_model_len or max(longest_request, min(self.model.max_position_embeddings or 8192, 8192))
        if longest_request > max_model_len:
            raise UserError(
                f"a request of {longest_request} tokens exceeds --max-model-len {max_model_len}; raise it or shorten the workload"
            )
        if capacity < longest_request:
            missing_gb = (
                (longest_request - capacity)
                * self.model.kv_bytes_for_context(longest_request, self.kv_dtype)
                / longest_request
                / 1e9
            )
            raise UserError(
                f"{self.model.name} on {self.tp}× {self.gpu.name}: the KV cache left after weights holds {capacity} tokens, "
                f"less than one {longest_request}-token request ({missing_gb:.2f} GB missing); raise --tp or use a larger GPU"
            )
        max_model_len = min(max_model_len, capacity)
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs or 1,
            max_num_batched_tokens=self.max_num_batched_tokens or 1,
            num_kv_blocks=num_blocks,
            block_size=DEFAULT_BLOCK_SIZE,
            enable_prefix_caching=self.enable_prefix_caching,
            enable_chunked_prefill=True,
            max_model_len=max(max_model_len, longest_request),
        )

    def cost_model(self) -> RooflineStepCost | MeasuredStepCost:
        """The step cost model `--cost-model` picks (see the module docstring)."""
        assert self.weight_dtype is not None
        inputs = (
            self.model,
            self.gpu,
            self.tp,
            self.ep,
            self.weight_dtype,
            self.kv_dtype,
            self.efficiency,
            self.async_scheduling,
            self.cost_model_kind,
            self.vllm_version,
            self.vision_shape,
            self.frontend.api_server_count,
        )
        if self._cost is not None and self._cost[0] == inputs:
            return self._cost[1]
        cost: RooflineStepCost | MeasuredStepCost
        if self.uses_kernels:
            from vlmserve.hardware.kernels.step_cost import MeasuredStepCost  # pyarrow: only when the tables are used

            cost = MeasuredStepCost(
                self.model,
                self.gpu,
                self.tp,
                self.weight_dtype,
                self.kv_dtype,
                self.efficiency,
                self.async_scheduling,
                vllm_version=self.vllm_version,
                vision=self.vision_shape,
                ep=self.ep,
                api_servers=self.frontend.api_server_count,
            )
        else:
            cost = self.roofline_cost_model()
        self._cost = (inputs, cost)
        return cost

    def roofline_cost_model(self) -> RooflineStepCost:
        """The calibrated roofline, whatever `--cost-model` says (napkin math, comparisons)."""
        assert self.weight_dtype is not None
        return RooflineStepCost(
            self.model,
            self.gpu,
            self.tp,
            self.weight_dtype,
            self.kv_dtype,
            self.efficiency,
            self.async_scheduling,
            api_servers=self.frontend.api_server_count,
        )

    def describe(self) -> dict[str, Any]:
        """The deployment as it goes into a simulated run's meta."""
        return {
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "replicas": self.replicas,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "routing": self.routing,
            "async_scheduling": self.async_scheduling,
            "calibration": self.calibration.source,
            "step_costs": "kernels" if self.uses_kernels else "roofline",
            "vllm_version": self.vllm_version,
        }
