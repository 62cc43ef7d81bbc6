"""The shared vocabulary: what is deployed (DeploymentSpec) and how it is loaded (LoadSpec).

Deploy-time and client-side parameters are kept apart on purpose: a load spec never
changes a server, and a benchmark result names the deployment it ran against.
Both load from YAML and fail with messages that name the field and what was wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from vlmserve.autoscale import AutoscaleRule
from vlmserve.bounded_read import CONFIG_FILE, Refused, read_bytes, yaml_shape
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS
from vlmserve.vllm_flags import VLLM_LORA_RANKS, check_engine_arg

EMBEDDED_MODEL = "embedded"
"""The model name that means: the tiny VLM vlmserve makes itself (see vlmserve.engines.embedded)."""


class EngineArgs(BaseModel):
    """vLLM engine arguments that are fixed when a replica starts.

    The fields below are the ones vlmserve itself reads (to plan memory, verify the served
    configuration, label metrics). Any other key is passed to `vllm serve` as a flag, after the
    installed vLLM's own parser confirms it exists (`vllm_flags.py`): a misspelling is refused
    with a suggestion, never silently dropped.
    """

    model_config = ConfigDict(extra="allow")

    dtype: str = "auto"
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=16)
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    limit_mm_per_prompt: dict[str, int] | None = None
    mm_processor_kwargs: JSONObject | None = None
    async_scheduling: bool | None = None
    enforce_eager: bool | None = Field(None, description="skip torch.compile; default: on for the embedded model only")
    served_model_name: str | None = None
    extra_args: list[str] = Field(default_factory=list, description="free-form extra engine flags")

    @model_validator(mode="after")
    def _known_vllm_flags(self) -> EngineArgs:
        for key in self.model_extra or {}:
            problem = check_engine_arg(key)
            if problem is not None:
                raise PydanticCustomError("unknown_vllm_flag", problem, {"key": key})
        return self

    def vllm_flags(self) -> JSONObject:
        """The keys beyond vlmserve's own fields, for the engine's command line."""
        return dict(self.model_extra or {})


class SimEngineOptions(BaseModel):
    """Options for the simulated engine (`--engine sim`), passed to `vlmserve engine sim`."""

    model_config = ConfigDict(extra="forbid")

    profile: str | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    cold_start_s: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="seconds each replica takes to start serving (port bound, connections refused meanwhile, as vLLM)",
    )
    extra_args: list[str] = Field(default_factory=list)
    rehearsal_optimum: dict[str, float] | None = Field(
        None,
        description="rehearse `vlmserve tune`: steps slow down away from these settings "
        "(vLLM flag names, e.g. {max_num_seqs: 32}; engines.sim.rehearsal)",
    )
    rehearsal_penalty: float = Field(2.0, ge=1.0, description="step-time factor per doubling away from rehearsal_optimum")


class LivenessOptions(BaseModel):
    """How the supervisor tells a hung replica from a busy one (see vlmserve.deploy.liveness).

    Every `interval_s` each ready replica gets `GET /health` with `timeout_s`; after
    `failures` failed checks in a row a 1-token generation with `probe_timeout_s` decides:
    an answer means busy (the count starts again), none means hung (killed and restarted).
    Worst-case detection: interval_s + failures x max(interval_s, timeout_s) + probe_timeout_s.
    The gateway is watched on /health alone: `failures` checks in a row without any answer and it
    is killed and restarted. A replica whose /health passes but whose engine metrics show requests
    waiting or running with no prompt or generation token processed for `stall_s` is probed the
    same way (vLLM counts prompt tokens when a prefill completes: keep stall_s above the longest
    prefill; null turns this check off).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(3.0, gt=0)
    failures: int = Field(3, ge=1)
    probe_timeout_s: float = Field(4.0, gt=0)
    stall_s: float | None = Field(120.0, gt=0)

    @property
    def detection_s(self) -> float:
        """The longest a hung replica goes unnoticed (15 s with the defaults)."""
        return self.interval_s + self.failures * max(self.interval_s, self.timeout_s) + self.probe_timeout_s


ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What an adapter's served name may be: it is a model name in requests, a label on metrics, a word in logs."""
MAX_SPEC_ADAPTERS = 256
"""Adapters one spec may declare: the gateway's per-adapter metric labels stay bounded by it."""


class LoraOptions(BaseModel):
    """LoRA adapters served beside the base model (vLLM's `--enable-lora` family; docs/lora.md).

    Mixed into DeploymentSpec as top-level fields. Paths are checked when `up` starts (the
    directory, its adapter_config.json, its rank against max_lora_rank): `export k8s` writes
    the pod's paths, which need not exist here."""

    lora_modules: dict[str, str] = Field(
        default_factory=dict,
        description="adapters to serve, name -> PEFT directory (or embedded:N for the "
        "embedded model's adapter N); each answers a 1-token generation before a replica is ready",
    )
    max_loras: int | None = Field(None, ge=1, le=MAX_SPEC_ADAPTERS, description="adapters in one batch (vLLM --max-loras)")
    max_lora_rank: int | None = Field(
        None, description=f"largest adapter rank, one of {', '.join(map(str, VLLM_LORA_RANKS))} (vLLM --max-lora-rank)"
    )
    max_cpu_loras: int | None = Field(
        None, ge=1, description="adapters kept in host memory, at least max_loras (vLLM --max-cpu-loras)"
    )

    @field_validator("lora_modules")
    @classmethod
    def _adapter_names(cls, modules: dict[str, str]) -> dict[str, str]:
        if len(modules) > MAX_SPEC_ADAPTERS:
            raise ValueError(f"{len(modules)} adapters; at most {MAX_SPEC_ADAPTERS} (load more at run time)")
        for name, path in modules.items():
            if not ADAPTER_NAME.fullmatch(name):
                raise ValueError(f"adapter name '{name[:80]}' is not allowed; use up to 64 letters, digits, '-', '_' or '.'")
            if not path.strip():
                raise ValueError(f"adapter '{name}' has no path; give its PEFT directory")
        return modules

    @field_validator("max_lora_rank")
    @classmethod
    def _rank_vllm_takes(cls, rank: int | None) -> int | None:
        if rank is not None and rank not in VLLM_LORA_RANKS:
            raise ValueError(f"{rank} is not a rank vLLM takes; use one of {', '.join(map(str, VLLM_LORA_RANKS))}")
        return rank

    @property
    def lora_enabled(self) -> bool:
        """LoRA is on when adapters are declared or slots are sized (for adapters loaded at run time)."""
        return bool(self.lora_modules) or self.max_loras is not None

    def _check_lora(self, served_name: str) -> None:
        """Cross-field rules, called from DeploymentSpec's validator."""
        if served_name in self.lora_modules:
            raise ValueError(f"adapter name '{served_name}' is the base model's served name; rename the adapter")
        if self.max_cpu_loras is not None and self.max_cpu_loras < (self.max_loras or 1):
            raise ValueError(
                f"max_cpu_loras {self.max_cpu_loras} is below max_loras {self.max_loras or 1}; "
                "vLLM keeps at least max_loras adapters in host memory"
            )


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

SPEC_FILE_PATHS = ("keys_file", "audit_log", "ssl_certfile", "ssl_keyfile", "log_dir")
"""Spec fields that are file paths: relative ones are read relative to the spec file."""


class DeploymentSpec(LoraOptions):
    """Everything `vlmserve up` needs to start and supervise a deployment."""

    model_config = ConfigDict(extra="forbid")

    name: str = "default"
    model: str = EMBEDDED_MODEL
    engine: Literal["vllm", "sim"] = "vllm"
    replicas: int = Field(1, ge=1, le=64)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535, description="gateway port; replicas take the ports after it")
    replica_base_port: int | None = Field(None, ge=1, le=65535)
    gateway: bool = True
    gateway_policy: str = LEAST_OUTSTANDING_TOKENS
    gateway_workers: int = Field(1, ge=1, le=64, description="gateway processes sharing its port (vlmserve gateway --workers)")
    gateway_discover: str | None = Field(
        None,
        description="gateway: also route to replicas found at run time beside the spec's own "
        "(file:PATH, dns:NAME:PORT or k8s:NAMESPACE/SERVICE[:PORTNAME]; vlmserve gateway --discover)",
    )
    gateway_state: str | None = Field(
        None,
        description="gateway: share tenants' rate limits and token budgets with other gateways through "
        "Redis, redis://[:PASSWORD@]HOST[:PORT][/DB] (vlmserve gateway --state); none: per process",
    )
    gateway_state_unavailable: Literal["open", "closed"] = Field(
        "open",
        description="gateway: when that Redis does not answer, admit on per-process limits (open) "
        "or refuse rate-limited requests with 503 (closed) (vlmserve gateway --state-unavailable)",
    )
    gateway_otlp_traces_endpoint: str | None = Field(
        None,
        description="gateway: export OpenTelemetry spans over OTLP/HTTP to this collector URL "
        "(vlmserve gateway --otlp-traces-endpoint); none: no gateway spans",
    )
    gateway_trace_sample_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="gateway: share of new traces kept (vlmserve gateway --trace-sample-ratio); none: the gateway's default",
    )
    devices: Literal["auto", "cpu", "gpu"] = "auto"
    cpu_threads_per_replica: int | None = Field(None, ge=1)
    kv_cache_space_gb: float | None = Field(None, gt=0)
    engine_args: EngineArgs = Field(default_factory=EngineArgs)
    recipe: bool | Literal["benchmark"] = Field(
        True,
        description="lay the model family's vLLM flags under engine_args (docs/recipes.md); "
        "false: engine_args alone; benchmark: also prefix caching off",
    )
    sim: SimEngineOptions = Field(default_factory=SimEngineOptions)
    env: dict[str, str] = Field(default_factory=dict)
    log_dir: str | None = None
    ready_timeout_s: float = Field(600.0, gt=0)
    liveness: LivenessOptions = Field(default_factory=LivenessOptions)
    autoscale: AutoscaleRule | None = Field(
        None,
        description="add and remove replicas on the engines' queue (docs/autoscaling.md); the same rule `export k8s` writes for KEDA",
    )
    # The trust boundary: what the gateway asks of clients, and what media the engines fetch.
    keys_file: str | None = Field(None, description="gateway: YAML file of tenants and API keys")
    audit_log: str | None = Field(None, description="gateway: one JSON line per request is appended here")
    ssl_certfile: str | None = Field(None, description="gateway: TLS certificate (PEM); needs ssl_keyfile")
    ssl_keyfile: str | None = Field(None, description="gateway: TLS private key (PEM); needs ssl_certfile")
    allowed_media_domains: list[str] = Field(
        default_factory=list, description="hosts image URLs may point at; empty: no remote media, images come inline (data: URLs)"
    )
    allow_internal_media_addresses: bool = Field(
        False,
        description="gateway: let allowed_media_domains resolve to loopback, private or metadata "
        "addresses (an internal image server, on purpose); off: such a host is refused (400)",
    )
    open: bool = Field(False, description="serve a non-loopback host without keys_file, on purpose")
    # Image preflight at the gateway (None: the gateway's defaults; a tenant may tighten them).
    max_image_bytes: int | None = Field(None, ge=1, description="gateway: refuse a larger image (400)")
    max_image_pixels: int | None = Field(None, ge=1, description="gateway: refuse an image with more pixels (400)")
    max_images_per_request: int | None = Field(None, ge=1, description="gateway: refuse more images per request (400)")
    image_downscale_max_side: int | None = Field(
        None, ge=16, description="gateway: resize images to at most this longest side (fewer prompt tokens)"
    )

    @field_validator("allowed_media_domains")
    @classmethod
    def _bare_host_names(cls, domains: list[str]) -> list[str]:
        for domain in domains:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", domain):
                raise ValueError(f"'{domain}' is not a host name; list bare host names like images.example.com")
        return domains

    @model_validator(mode="after")
    def _tls_pair(self) -> "DeploymentSpec":
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("give both ssl_certfile and ssl_keyfile, or neither")
        return self

    @model_validator(mode="after")
    def _lora_fits(self) -> "DeploymentSpec":
        self._check_lora(self.engine_args.served_model_name or self.model)
        return self

    @property
    def replica_host(self) -> str:
        """Where replicas listen: loopback behind a gateway (the gateway is the only door, so its
        keys cannot be walked around), else `host`."""
        return "127.0.0.1" if self.gateway else self.host

    @property
    def loopback_only(self) -> bool:
        """Is `host` reachable from this machine only?"""
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise ValueError("use letters, digits, '-', '_' or '.' only")
        return value

    def replica_ports(self) -> list[int]:
        """Ports of the replicas: consecutive, after the gateway port unless set."""
        base = self.replica_base_port or (self.port + 1)
        return [base + index for index in range(self.replicas)]


SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
_SLO_KEY = re.compile(r"^(ttft|tpot|itl|e2e)_(p50|p90|p95|p99|p999|mean)$")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)?\s*$")


def parse_duration_s(text: str) -> float:
    """Parse '500ms', '5s', '0.2' (seconds) into seconds, or raise ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"'{text}' is not a duration; write it like 500ms or 5s")
    value = float(match.group(1))
    unit = match.group(2) or "s"
    return value / 1000.0 if unit == "ms" else value / 1e6 if unit == "us" else value


REQUEST_TYPES: tuple[str, ...] = ("text", "image", "multi-image", "video", "audio")
"""What a request carries, for per-type figures and SLOs (RequestRecord.request_type)."""

_SLO_KEY_HELP = "use <ttft|tpot|itl|e2e>_<p50|p90|p95|p99|p999|mean>"

RATE_OBJECTIVES: tuple[str, ...] = ("schema_valid", "tool_call_valid")
"""Objectives on a share of answers (`--slo schema_valid>=0.99`), judged on the feature workloads' checks."""
_RATE_HELP = f"or a rate objective {' / '.join(RATE_OBJECTIVES)}>=FRACTION (e.g. schema_valid>=0.99 or >=99%)"


def parse_rate(text: str) -> float:
    """'0.99' or '99%' as a fraction in [0, 1], or raise ValueError."""
    cleaned = text.strip()
    try:
        value = float(cleaned[:-1]) / 100.0 if cleaned.endswith("%") else float(cleaned)
    except ValueError:
        raise ValueError(f"'{text}' is not a fraction; write it like 0.99 or 99%") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"'{text}' is outside 0..1 (0%..100%)")
    return value


class SLO(BaseModel):
    """Latency objectives, each a percentile bound in seconds, e.g. ttft_p95 ≤ 0.5 s.

    `bounds_s` apply to the whole run (and to every request type); `by_type` adds or tightens
    bounds for one request type (`image:ttft_p95=800ms`), judged on that type's requests alone.
    """

    model_config = ConfigDict(extra="forbid")

    bounds_s: dict[str, float] = Field(default_factory=dict)
    by_type: dict[str, dict[str, float]] = Field(default_factory=dict)
    min_rates: dict[str, float] = Field(default_factory=dict)
    """Lower bounds on a share of answers (`schema_valid`, `tool_call_valid`), judged on the whole run."""

    @field_validator("min_rates")
    @classmethod
    def _rates_known(cls, rates: dict[str, float]) -> dict[str, float]:
        for key, value in rates.items():
            if key not in RATE_OBJECTIVES:
                raise ValueError(f"unknown rate objective '{key}'; use {', '.join(RATE_OBJECTIVES)}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"rate objective '{key}' must be a fraction between 0 and 1")
        return rates

    @field_validator("bounds_s")
    @classmethod
    def _keys_known(cls, bounds: dict[str, float]) -> dict[str, float]:
        for key, value in bounds.items():
            if not _SLO_KEY.match(key):
                raise ValueError(f"unknown SLO '{key}'; {_SLO_KEY_HELP}")
            if value <= 0:
                raise ValueError(f"SLO '{key}' must be positive")
        return bounds

    @field_validator("by_type")
    @classmethod
    def _types_known(cls, by_type: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for request_type, bounds in by_type.items():
            if request_type not in REQUEST_TYPES:
                raise ValueError(f"unknown request type '{request_type}'; use {', '.join(REQUEST_TYPES)}")
            cls._keys_known(bounds)
        return by_type

    @classmethod
    def parse(cls, text: str | None) -> "SLO":
        """Parse 'ttft_p95=500ms,image:ttft_p95=800ms' as given on the command line.

        A `TYPE:` prefix makes an objective apply to that request type only.
        """
        if not text:
            return cls()
        bounds: dict[str, float] = {}
        by_type: dict[str, dict[str, float]] = {}
        rates: dict[str, float] = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if ">=" in part:
                cls._parse_rate(part, rates)
                continue
            if "=" not in part:
                raise UserError(f"--slo: '{part}' has no '='; write it like ttft_p95=500ms,image:ttft_p95=800ms")
            name, raw = (item.strip() for item in part.split("=", 1))
            request_type, _, key = name.rpartition(":")
            if ":" in name and request_type not in REQUEST_TYPES:
                raise UserError(f"--slo: unknown request type '{request_type}' in '{part}'; use {', '.join(REQUEST_TYPES)}")
            if key in RATE_OBJECTIVES:
                raise UserError(f"--slo: '{part}': a rate objective is a lower bound; write {key}>={raw}")
            if not _SLO_KEY.match(key):
                raise UserError(f"--slo: unknown objective '{key}'; {_SLO_KEY_HELP}=DURATION, {_RATE_HELP}")
            target = by_type.setdefault(request_type, {}) if request_type else bounds
            if key in target:
                raise UserError(f"--slo: '{name}' is given twice; keep one bound")
            try:
                target[key] = parse_duration_s(raw)
            except ValueError as err:
                raise UserError(f"--slo: {err}") from None
            if target[key] <= 0:
                raise UserError(f"--slo: '{name}' must be positive")
        return cls(bounds_s=bounds, by_type=by_type, min_rates=rates)

    @staticmethod
    def _parse_rate(part: str, rates: dict[str, float]) -> None:
        """One 'schema_valid>=0.99' objective into `rates`."""
        name, raw = (item.strip() for item in part.split(">=", 1))
        if ":" in name:
            raise UserError(f"--slo: '{part}': rate objectives apply to the whole run, not to one request type")
        if name not in RATE_OBJECTIVES:
            raise UserError(
                f"--slo: unknown rate objective '{name}'; use {', '.join(RATE_OBJECTIVES)} "
                "(latency objectives are written ttft_p95=500ms)"
            )
        if name in rates:
            raise UserError(f"--slo: '{name}' is given twice; keep one bound")
        try:
            rates[name] = parse_rate(raw)
        except ValueError as err:
            raise UserError(f"--slo: {name}: {err}") from None

    def refuse_rates(self, verb: str) -> "SLO":
        """Itself, or one line when it has rate objectives `verb` cannot judge (it sees no real answers)."""
        if self.min_rates:
            names = ", ".join(f"{name}>=" for name in self.min_rates)
            raise UserError(
                f"--slo {names}: rate objectives judge real answers (vlmserve bench --features); "
                f"{verb} takes latency objectives only"
            )
        return self

    def for_type(self, request_type: str) -> "SLO":
        """The objectives one request type is judged by: the run's, with that type's own on top."""
        return SLO(bounds_s={**self.bounds_s, **self.by_type.get(request_type, {})})

    def per_request_bounds(self) -> dict[str, float]:
        """Bounds that apply to each request (metric -> seconds) for goodput counting."""
        return {key.split("_", 1)[0]: value for key, value in self.bounds_s.items()}


MAX_BENCH_ADAPTERS = 4096
"""Adapters one bench run may spread its requests over."""


class LoadSpec(BaseModel):
    """Client-side load: workload, lengths, concurrency or rate, count or duration."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    api: Literal["chat", "completions"] = "chat"
    dataset: Literal["random", "sharegpt", "images", "mixed", "trace"] = "random"
    dataset_path: str | None = None
    input_len: int = Field(128, ge=1)
    output_len: int = Field(64, ge=1)
    concurrency: int | None = Field(None, ge=1)
    rate: float | None = Field(None, gt=0)
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    burstiness: float = Field(1.0, gt=0)
    num_requests: int | None = Field(None, ge=1)
    duration_s: float | None = Field(None, gt=0)
    warmup: int = Field(0, ge=0)
    multi_turn: Literal["first", "dataset", "live"] = "first"
    image_size: tuple[int, int] = (64, 64)
    images_per_request: int = Field(1, ge=0)
    image_format: Literal["png", "jpeg"] = "png"
    image_size_mix: list[tuple[int, int, float]] | None = None
    """Resolution buckets (width, height, weight): each synthetic image's size is drawn from them."""
    images_per_request_mix: dict[int, float] | None = None
    """{images: weight}: how many images each image request carries (1 = image, more = multi-image)."""
    image_repeat_rate: float | None = Field(None, ge=0, le=1, description="share of image requests that resend earlier images")
    """The stated repeat rate (bench.workloads.image_reuse); None: images are drawn without reuse control."""
    image_popularity_skew: float = Field(1.0, ge=0, description="Zipf exponent of which earlier image a repeat picks")
    vision_budget_mix: dict[int, float] | None = None
    """{max_soft_tokens: weight}: a Gemma-style vision budget per request (mm_processor_kwargs)."""
    mix: dict[str, float] | None = None
    lora_adapters: list[str] | None = Field(
        None,
        max_length=MAX_BENCH_ADAPTERS,
        description="LoRA adapters each conversation is sent to (its model), drawn by lora_popularity",
    )
    lora_popularity: Literal["uniform", "zipf"] = "uniform"
    lora_skew: float = Field(1.0, gt=0, le=10, description="Zipf exponent of adapter popularity (lora_popularity zipf)")
    lora_base_share: float = Field(0.0, ge=0, le=1, description="share of conversations sent to the base model")
    extra_body: JSONObject | None = None
    features: list[Literal["tools", "structured", "thinking"]] = Field(default_factory=list)
    """Feature workloads layered on the dataset (bench.features): tool schemas, a response JSON schema, thinking."""
    tool_choice: Literal["named", "required", "auto"] = "named"
    """tools: how the tool is asked for; named (one offered tool by name) needs no model judgement."""
    seed: int = 0
    prompt_pool_size: int | None = Field(
        None, ge=1, description="distinct prompts the run cycles through; None: every request gets its own prompt"
    )
    """Explicit prompt reuse (AIPerf's --num-dataset-entries). The default keeps the engine's
    prefix cache from serving repeated prompts, which flatters TTFT (0.73 hit rate at 4 users)."""
    shared_prefix_len: int = Field(0, ge=0, description="tokens at the start of every prompt that all requests share")
    """Part of input_len, not added to it (unlike `vllm bench serve --random-prefix-len`):
    a 512-token prompt with a 384-token shared prefix has a 128-token unique tail."""
    # bench details (defaults keep older specs valid)
    tokenizer: str | None = None
    """Local tokenizer path/name for exact prompt lengths; else the server's /tokenize."""
    ignore_eos: bool = True
    per_chunk_usage: bool = True
    """Ask for usage on every chunk (exact tokens per chunk) where the server supports it."""
    fixed_output_len: bool = False
    """sharegpt: ask for output_len tokens instead of the dataset reply's length."""
    image_dir: str | None = None
    image_urls: list[str] | None = None
    mm_processor_kwargs: JSONObject | None = None
    request_timeout_s: float = Field(600.0, gt=0)
    workers: int | None = Field(None, ge=1, description="client worker processes; None: as the load needs")
    repeat: int = Field(1, ge=1, le=100, description="runs of the same load, fresh prompts each (a seed per repeat)")
    """More than 1 gives each headline figure a mean and a 95 % confidence interval (bench.repeats)."""
    stop_when_oversaturated: bool | None = Field(
        None, description="stop an open loop early once the server is past saturation; None: the verb's default"
    )
    load_shape: str | None = Field(
        None,
        description="an open loop whose rate follows a shape (bench.load_shapes); rate is then its peak, duration_s its length",
    )
    """None means the verb decides: off for `bench`, on for `sweep` and `slo-search` (bench.saturation)."""

    @model_validator(mode="after")
    def _one_load_and_one_stop(self) -> "LoadSpec":
        if self.concurrency is not None and self.rate is not None:
            raise ValueError("give either concurrency or rate, not both")
        if self.concurrency is None and self.rate is None and self.dataset != "trace":
            raise ValueError("give concurrency (closed loop) or rate (open loop)")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")
        if self.dataset in ("sharegpt", "trace") and not self.dataset_path:
            raise ValueError(f"dataset '{self.dataset}' needs dataset_path")
        if self.shared_prefix_len and self.dataset != "random":
            raise ValueError("shared_prefix_len applies to the random dataset (it writes its own prompts)")
        if self.features and self.api != "chat":
            raise ValueError(
                f"features {','.join(self.features)} need api chat (tools, response_format and "
                "chat_template_kwargs are chat-completions fields)"
            )
        if self.lora_adapters is not None and (
            len(set(self.lora_adapters)) != len(self.lora_adapters) or not all(name.strip() for name in self.lora_adapters)
        ):
            raise ValueError("lora_adapters: name each adapter once, none empty")
        if self.shared_prefix_len >= self.input_len:
            raise ValueError(
                f"shared_prefix_len {self.shared_prefix_len} must be below input_len {self.input_len} "
                "(the prefix is part of the prompt); shorten the prefix"
            )
        return self


def describe_validation_error(err: ValidationError, source: str) -> str:
    """One line naming the first bad field and what was wrong with it."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field; check its spelling"
    elif first["type"] == "unknown_vllm_flag":
        where = f"{where}.{first['ctx']['key']}"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: field '{where}': {message}{more}"


def load_yaml_file(path: str | Path) -> JSONValue:
    """Read a YAML file (a spec, a keys file, a sweep), turning missing files, syntax errors and
    files over the config-file bounds (size, nesting, nodes with aliases expanded: an alias
    bomb) into UserError. The bounds are checked on the parser's events, before any node is built."""
    file_path = Path(path)
    if not file_path.is_file():
        raise UserError(f"{file_path}: no such file; check the path")
    try:
        text = read_bytes(file_path, CONFIG_FILE).decode("utf-8")
        yaml_shape(text, CONFIG_FILE)
        return yaml.safe_load(text)
    except OSError as err:
        raise UserError(f"{file_path}: cannot read it ({err.strerror or type(err).__name__}); check its permissions") from None
    except UnicodeDecodeError:
        raise UserError(f"{file_path}: not UTF-8 text; a YAML file is text") from None
    except Refused as err:
        raise UserError(f"{file_path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{file_path}: not valid YAML{where}; fix the syntax") from None


def resolve_spec_paths(data: JSONObject, spec_file: str | Path) -> JSONObject:
    """Relative file paths in a spec file mean: next to the spec file (not the current directory)."""
    base = Path(spec_file).resolve().parent
    resolved = dict(data)
    for key in SPEC_FILE_PATHS:
        value = resolved.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            resolved[key] = str(base / value)
    return resolved


def load_deployment_spec(path: str | Path) -> DeploymentSpec:
    """Load and validate a deployment spec; a bad one is one clear line."""
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: a deployment spec is a YAML mapping (model:, replicas:, ...)")
    data = resolve_spec_paths(data, path)
    try:
        return DeploymentSpec.model_validate(data)
    except ValidationError as err:
        raise UserError(describe_validation_error(err, str(path))) from None
