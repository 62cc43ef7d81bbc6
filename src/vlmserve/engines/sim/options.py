"""Everything a sim engine is started with, validated once, and the factory for its scheduler."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from vlmserve.errors import UserError, check_listen_port
from vlmserve.hardware.roofline import make_step_cost_model
from vlmserve.sched.constant import ConstantLatencyScheduler
from vlmserve.sched.engine_core import EngineCore
from vlmserve.sched.frontend import FrontendConfig
from vlmserve.sched.lora_slots import LoraConfig
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig
from vlmserve.vision.tokens import ImageTokenEstimator, estimator_for_model_dir

GEMMA_IMAGE_BUDGETS = (70, 140, 280, 560, 1120)


@dataclass(frozen=True)
class OutputLengthDistribution:
    """How many tokens a request generates before its natural end (EOS), when not forced.

    Written as `fixed:N`, `uniform:LOW:HIGH`, `exponential:MEAN` or `lognormal:MEAN:SIGMA`
    (MEAN is the distribution's mean in tokens; SIGMA the log-space spread).
    """

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "OutputLengthDistribution":
        parts = text.strip().split(":")
        try:
            kind, numbers = parts[0], [float(part) for part in parts[1:]]
        except ValueError:
            raise UserError(_DIST_HELP.format(text=text)) from None
        expected = {"fixed": 1, "uniform": 2, "exponential": 1, "lognormal": 2}.get(kind)
        if expected is None or len(numbers) != expected or any(value <= 0 for value in numbers):
            raise UserError(_DIST_HELP.format(text=text))
        if kind == "uniform" and numbers[1] < numbers[0]:
            raise UserError(f"output length 'uniform:{numbers[0]:g}:{numbers[1]:g}': HIGH must be >= LOW")
        return cls(kind, numbers[0], numbers[1] if len(numbers) > 1 else 0.0)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "exponential":
            value = rng.expovariate(1.0 / self.a)
        else:
            sigma = self.b
            value = rng.lognormvariate(math.log(self.a) - sigma * sigma / 2.0, sigma)
        return max(1, int(round(value)))


_DIST_HELP = (
    "output length distribution '{text}' is not understood; write fixed:N, uniform:LOW:HIGH, "
    "exponential:MEAN or lognormal:MEAN:SIGMA with positive numbers"
)


@dataclass
class FaultOptions:
    """Failures to inject, for testing what sits in front of an engine."""

    error_rate: float = 0.0
    """Fraction of API requests answered with an injected 5xx instead of being served."""
    error_codes: tuple[int, ...] = (500,)
    """Status codes the injected errors are drawn from."""
    crash_after: int | None = None
    """The process exits (code 3) when request number crash_after + 1 arrives."""
    startup_delay_s: float = 0.0
    """/health (and the API) answer 503 for this long after start."""
    stall_after_tokens: int | None = None
    """Streams stop sending after this many tokens ..."""
    stall_s: float | None = None
    """... for this long (None: forever, until the client gives up)."""
    drop_after_tokens: int | None = None
    """Streams are cut (transport closed abruptly) after this many tokens."""
    fault_rate: float = 1.0
    """Fraction of streams that stall/drop (1.0: every stream)."""
    freeze_after: int | None = None
    """Test-only: the engine loop stops for good (no token for any request, requests pile up as
    waiting) when request number freeze_after + 1 arrives, while /health and /metrics still
    answer: a stuck engine core behind a healthy API server, for the supervisor's liveness check."""
    poison_marker: str | None = None
    """A request whose body contains this text is answered 500 (a fault that follows the request)."""
    swap_answer_rate: float = 0.0
    """Fraction of requests arriving while others are in flight that get one of those requests'
    answer instead of their own (preferring one of the same prompt length): the silent wrong
    answer of a batching or cache bug, which `vlmserve consistency` must catch."""

    def validate(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise UserError(f"--error-rate must be between 0 and 1, got {self.error_rate}")
        if not 0.0 <= self.swap_answer_rate <= 1.0:
            raise UserError(f"--swap-answer-rate must be between 0 and 1, got {self.swap_answer_rate}")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise UserError(f"--fault-rate must be between 0 and 1, got {self.fault_rate}")
        for code in self.error_codes:
            if not 500 <= code <= 599:
                raise UserError(f"--error-codes takes 5xx status codes, got {code}")
        for name in ("crash_after", "freeze_after", "stall_after_tokens", "drop_after_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UserError(f"--{name.replace('_', '-')} must not be negative, got {value}")
        if not (math.isfinite(self.startup_delay_s) and self.startup_delay_s >= 0):  # NaN passes `< 0`
            raise UserError(f"--startup-delay must be 0 or more seconds, got {self.startup_delay_s}")
        if self.stall_s is not None and not (math.isfinite(self.stall_s) and self.stall_s >= 0):
            raise UserError(f"--stall-s must be 0 or more seconds (leave it out to stall for good), got {self.stall_s}")


@dataclass
class SimEngineConfig:
    """How one sim engine behaves; `vlmserve engine sim` flags map one-to-one onto these."""

    model: str = "sim-model"
    served_model_names: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    seed: int = 0
    profile: str | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_num_encoder_input_tokens: int | None = None
    """Image tokens the encoder may run per step (None: max_num_batched_tokens, as vLLM)."""
    encoder_cache_size: int | None = None
    """Image tokens of encoder output the encoder cache holds (None: max_num_batched_tokens, as vLLM)."""
    disable_chunked_mm_input: bool = False
    num_kv_blocks: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    image_tokens: int = 256
    """Vision tokens per image unless the request picks a budget via mm_processor_kwargs."""
    allowed_image_budgets: tuple[int, ...] = ()
    """If set, the only budgets a request may pick (e.g. Gemma's 70/140/280/560/1120)."""
    model_config_dir: str | None = None
    """A model directory whose config prices each image by the model's own rule (vision.tokens)."""
    api_server_count: int = 1
    """Frontend processes preprocessing images (vLLM's --api-server-count); see sched.frontend."""
    mm_preprocess_ms_per_image: float = 0.0
    mm_preprocess_ms_per_megapixel: float = 0.0
    """Frontend preprocessing cost of an image not in the multimodal cache (0 and 0: not priced)."""
    mm_cache_items: int = 1024
    """Images the multimodal cache holds (0: no cache): a repeat skips preprocessing and the encoder."""
    output_len: OutputLengthDistribution = field(default_factory=lambda: OutputLengthDistribution("lognormal", 200, 0.8))
    faults: FaultOptions = field(default_factory=FaultOptions)
    reject_over_context: bool = False
    """Refuse prompt + max_tokens > max_model_len with 400 (earlier vLLM) instead of clamping (vLLM 0.32)."""
    record_timing: bool = True
    """Record scheduled vs actual emission time of every chunk (exposed at /debug/timing)."""
    trace_file: str | None = None
    """Append one JSON line per ended request with its arrival and chunk emission times (see `trace`)."""
    gpu: str | None = None
    """Planner mode: time steps with the roofline model of `model` on `tp` × this GPU."""
    tp: int = 1
    cold_start_s: float = 0.0
    """Seconds between the process start and serving: the port is bound at once (no one else can
    take it) but listens only after this, so connections are refused meanwhile, as vLLM 0.32 binds
    its port before loading the model and starts its HTTP server once the engine is ready. Its
    phases are logged in vLLM's own words (server.cold_start), so one parser can read both engines."""
    lora_modules: tuple[str, ...] = ()
    """LoRA adapters it serves by name (listed in /v1/models with the model as parent); weights are not simulated."""
    max_loras: int | None = None
    """Adapters in one step (vLLM's --max-loras; None: 1 when adapters are served); sched.lora_slots."""
    max_cpu_loras: int | None = None
    lora_load_ms: float = 0.0
    """Time a step spends loading an adapter that is not in the host-memory adapter cache."""
    lora_step_ms: float = 0.0
    """Time each distinct adapter in a step adds (the LoRA kernels run per adapter)."""
    rehearsal_optimum: str | None = None
    """Rehearse `vlmserve tune`: steps slow down away from this optimum (engines.sim.rehearsal)."""
    rehearsal_penalty: float = 2.0
    """Step-time factor per doubling away from `rehearsal_optimum`."""

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model,)

    @property
    def constant_mode(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None

    def validate(self) -> None:
        """Raise UserError for combinations the engine cannot run with."""
        if self.constant_mode and (self.profile or self.gpu):
            chosen = "--profile" if self.profile else "--gpu"
            raise UserError(f"{chosen} and --ttft-ms/--itl-ms exclude each other; pick one timing model")
        if self.constant_mode and self.rehearsal_optimum:
            raise UserError(
                "--rehearsal-optimum scales a scheduler's step costs; constant mode (--ttft-ms/--itl-ms) has none; use --profile"
            )
        for flag, value in (("--ttft-ms", self.ttft_ms), ("--itl-ms", self.itl_ms)):
            if value is not None and not (math.isfinite(value) and value >= 0):  # NaN passes `< 0`
                raise UserError(f"--ttft-ms and --itl-ms must be 0 or more milliseconds: {flag} is {value}")
        if self.image_tokens < 1:
            raise UserError("--image-tokens must be at least 1")
        if self.constant_mode and (self.lora_modules or self.max_loras):
            raise UserError(
                "--lora-module: adapter slots are modelled with vLLM's scheduler rules; use --profile, not --ttft-ms/--itl-ms"
            )
        if not all(math.isfinite(value) and value >= 0 for value in (self.lora_load_ms, self.lora_step_ms)):
            raise UserError("--lora-load-ms and --lora-step-ms must be 0 or more milliseconds")
        for problem in self.frontend_config().validate():
            raise UserError(problem)
        check_listen_port(self.port)
        self.faults.validate()
        if not (math.isfinite(self.cold_start_s) and self.cold_start_s >= 0):
            raise UserError(f"--cold-start-s must be 0 or more seconds, got {self.cold_start_s}")
        if self.trace_file and not Path(self.trace_file).resolve().parent.is_dir():
            raise UserError(f"--trace-file {self.trace_file}: its directory does not exist; create it or pick another path")
        try:
            self.scheduler_config().validate()
        except ValueError as err:
            raise UserError(str(err)) from None
        make_step_cost_model(self.profile, model=self.model, gpu=self.gpu, tp=self.tp)  # bad choice -> UserError
        self.rehearsal_factor()  # a bad optimum -> UserError

    def rehearsal_factor(self) -> float:
        """The step-time factor of the rehearsal cost model (1.0 without one)."""
        from vlmserve.engines.sim.rehearsal import RehearsalOptimum

        if not self.rehearsal_optimum:
            return 1.0
        optimum = RehearsalOptimum.parse(self.rehearsal_optimum, self.rehearsal_penalty)
        return optimum.factor({name: float(getattr(self, name)) for name in optimum.optimum})

    def _planned_kv_blocks(self) -> int:
        """Planner mode: the blocks the GPU memory left after weights holds."""
        from vlmserve.hardware.roofline import roofline_kv_blocks

        typical = self.max_model_len // 4
        return roofline_kv_blocks(self.model, self.gpu or "", self.tp, typical, self.block_size)

    def image_estimator(self) -> ImageTokenEstimator | None:
        """The image token rule: the model directory's, the planner model's (with --gpu), or None
        (every image costs --image-tokens)."""
        if self.model_config_dir:
            if not (Path(self.model_config_dir) / "config.json").is_file():
                raise UserError(f"--model-config-dir {self.model_config_dir}: no config.json there; give a model directory")
            return estimator_for_model_dir(self.model_config_dir)
        if self.gpu:
            from vlmserve.hardware.models import load_model

            vision = load_model(self.model).vision
            return vision.estimator if vision else None
        return None

    def frontend_config(self) -> FrontendConfig:
        return FrontendConfig(
            self.api_server_count, self.mm_preprocess_ms_per_image, self.mm_preprocess_ms_per_megapixel, self.mm_cache_items
        )

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_encoder_input_tokens=self.max_num_encoder_input_tokens,
            encoder_cache_size=self.encoder_cache_size,
            disable_chunked_mm_input=self.disable_chunked_mm_input,
            num_kv_blocks=self._planned_kv_blocks() if self.gpu else self.num_kv_blocks,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            enable_chunked_prefill=self.enable_chunked_prefill,
            max_model_len=self.max_model_len,
            lora=LoraConfig(self.max_loras or 1, self.max_cpu_loras, self.lora_load_ms / 1000.0, self.lora_step_ms / 1000.0)
            if self.lora_modules or self.max_loras
            else None,
        )


def build_engine_core(config: SimEngineConfig) -> EngineCore:
    """The scheduler that times this engine: constant latencies, or vLLM's rules on a cost model."""
    if config.constant_mode:
        return ConstantLatencyScheduler(
            ttft_s=(config.ttft_ms or 0.0) / 1000.0,
            itl_s=(config.itl_ms or 0.0) / 1000.0,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
        )
    cost = make_step_cost_model(config.profile, model=config.model, gpu=config.gpu, tp=config.tp)
    if config.rehearsal_optimum:
        from vlmserve.engines.sim.rehearsal import RehearsalCost

        cost = RehearsalCost(cost, config.rehearsal_factor())
    return Scheduler(config.scheduler_config(), cost)
