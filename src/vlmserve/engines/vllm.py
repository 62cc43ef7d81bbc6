"""How one vLLM replica is launched: its argv, its environment, its devices.

The engine runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console
script fails on some installs on a package-metadata lookup; the module entry point does
not). This module only computes the command (`VllmLauncher`, the vLLM side of
`engines.launcher.EngineLauncher`); starting and watching it is the supervisor's job, so the
same launch can be printed, exported to Kubernetes, tested and reproduced by hand.

Device placement differs by machine:
- GPU: each replica gets its own group of `tensor_parallel_size` GPUs via
  CUDA_VISIBLE_DEVICES, so replicas never share a device.
- CPU (vLLM's CPU build): `--gpu-memory-utilization` would reserve that fraction of *host*
  memory, so the KV cache is sized with VLLM_CPU_KVCACHE_SPACE (whole GB) instead, and each
  replica's OpenMP threads are bound to their own cores with VLLM_CPU_OMP_THREADS_BIND.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vlmserve.bounded_read import CONFIG_FILE, loads_json, read_bytes
from vlmserve.engines.launcher import EngineLaunch, EventSink, ExpectedConfig, program, served_model_name
from vlmserve.engines.lora import lora_argv, resolved_adapters
from vlmserve.errors import UserError
from vlmserve.spec import EMBEDDED_MODEL, DeploymentSpec
from vlmserve.vllm_flags import engine_arg_argv

VLLM_MODULE = "vllm.entrypoints.openai.api_server"

DeviceKind = Literal["cpu", "gpu"]

DEFAULT_CPU_KV_CACHE_GB = 1
"""KV cache per CPU replica when the spec does not say: enough for the embedded model."""

CPU_ENGINE_OVERHEAD_GB = 2.5
"""Host memory a CPU engine needs besides weights and KV cache (Python, torch, the API
server and the engine-core process). Measured: about 2.5 GB RSS over the API server, engine core and worker
for the embedded model, besides its 1 GB KV cache."""

NO_REMOTE_MEDIA_DOMAIN = "no-remote-media.invalid"
"""What `--allowed-media-domains` gets when the spec allows no remote media: vLLM reads an empty
allowlist as "any host", so a name under .invalid (RFC 2606: never resolves) stands for none."""

MEDIA_REDIRECTS_ENV = {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"}
"""Replicas never follow a redirect when they fetch a media URL: vLLM checks `--allowed-media-domains`
against the URL it was given only, so an allowlisted host answering 302 to http://169.254.169.254/
or http://127.0.0.1:8000/ would otherwise lead the engine inside (vLLM's default: follow)."""

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set."""

GPU_ENGINE_HOST_OVERHEAD_GB = 4.0
"""Host memory a GPU engine process needs (CUDA context, torch, tokenizer, API server)."""


def detect_device_kind(requested: Literal["auto", "cpu", "gpu"] = "auto") -> DeviceKind:
    """'auto' means GPU when nvidia-smi lists one, CPU otherwise."""
    if requested != "auto":
        return requested
    return "gpu" if gpu_count() > 0 else "cpu"


def gpu_count() -> int:
    """GPUs that nvidia-smi can see (0 when there is no driver or no nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    if listed.returncode != 0:
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def usable_cpus() -> list[int]:
    """CPU ids this process may run on (respects taskset/cgroup affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def cpu_bind_groups(replicas: int, threads_per_replica: int | None, cpus: list[int] | None = None) -> list[str]:
    """One VLLM_CPU_OMP_THREADS_BIND value per replica: disjoint core ranges while they last.

    With 2 cores and 2 replicas that is "0" and "1". When there are more replicas than
    cores, replicas share cores round-robin (slow, but it starts; the supervisor says so).
    """
    cpus = cpus if cpus is not None else usable_cpus()
    per_replica = threads_per_replica or max(1, len(cpus) // replicas)
    groups = []
    for index in range(replicas):
        start = (index * per_replica) % len(cpus)
        chosen = [cpus[(start + offset) % len(cpus)] for offset in range(min(per_replica, len(cpus)))]
        groups.append(_cpu_list_text(chosen))
    return groups


def _cpu_list_text(cpus: list[int]) -> str:
    """[0,1,2,5] -> '0-2,5' (the format VLLM_CPU_OMP_THREADS_BIND takes)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    run_start = previous = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        parts.append(str(run_start) if run_start == previous else f"{run_start}-{previous}")
        if cpu is not None:
            run_start = previous = cpu
    return ",".join(parts)


def gpu_groups(replicas: int, tensor_parallel_size: int, available: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES per replica: consecutive groups of tensor_parallel_size GPUs."""
    needed = replicas * tensor_parallel_size
    if needed > available:
        raise UserError(
            f"{replicas} replica(s) x tensor-parallel-size {tensor_parallel_size} need {needed} GPUs "
            f"but {available} are visible; lower --replicas or --tensor-parallel-size"
        )
    return [
        ",".join(str(gpu) for gpu in range(index * tensor_parallel_size, (index + 1) * tensor_parallel_size))
        for index in range(replicas)
    ]


def cpu_kv_cache_gb(spec: DeploymentSpec) -> int:
    """VLLM_CPU_KVCACHE_SPACE takes whole GB; round a fractional spec value up."""
    if spec.kv_cache_space_gb is None:
        return DEFAULT_CPU_KV_CACHE_GB
    return max(1, math.ceil(spec.kv_cache_space_gb))


def engine_argv(spec: DeploymentSpec, model_path: str, port: int, device_kind: DeviceKind, host: str | None = None) -> list[str]:
    """argv for one replica: this interpreter running vLLM's API server module, then its flags.

    host: where it listens; default `spec.replica_host` (loopback behind the gateway)."""
    return program(VLLM_MODULE) + engine_arguments(spec, model_path, port, device_kind, host)


def engine_arguments(
    spec: DeploymentSpec, model_path: str, port: int, device_kind: DeviceKind, host: str | None = None
) -> list[str]:
    """The flags for one replica; only flags the spec sets are passed, so vLLM's defaults stay."""
    args = spec.engine_args
    argv = [
        "--model",
        model_path,
        "--served-model-name",
        served_model_name(spec),
        "--host",
        host or spec.replica_host,
        "--port",
        str(port),
        "--dtype",
        args.dtype,
    ]
    if args.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    optional: dict[str, object | None] = {
        "--max-model-len": args.max_model_len,
        "--max-num-seqs": args.max_num_seqs,
        "--max-num-batched-tokens": args.max_num_batched_tokens,
        "--kv-cache-dtype": args.kv_cache_dtype,
    }
    if device_kind == "gpu":
        optional["--gpu-memory-utilization"] = args.gpu_memory_utilization
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    if args.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching")
    if args.async_scheduling is not None:
        argv.append("--async-scheduling" if args.async_scheduling else "--no-async-scheduling")
    if eager_by_default(spec) if args.enforce_eager is None else args.enforce_eager:
        argv.append("--enforce-eager")
    if args.limit_mm_per_prompt is not None:
        argv += ["--limit-mm-per-prompt", _json(args.limit_mm_per_prompt)]
    if args.mm_processor_kwargs is not None:
        argv += ["--mm-processor-kwargs", _json(args.mm_processor_kwargs)]
    # media URLs the gateway lets through (video, audio) are fetched by the engine: only from listed
    # hosts (SSRF), by default from none, and never through a redirect (MEDIA_REDIRECTS_ENV)
    argv += ["--allowed-media-domains", *(spec.allowed_media_domains or [NO_REMOTE_MEDIA_DOMAIN])]
    given = args.vllm_flags()
    if spec.gateway and "trust_request_mm_kwargs" not in given and _has_flag("trust_request_mm_kwargs"):
        # The gateway is the only door and polices per-request processor kwargs (it adds its own
        # when downscaling images), so the replicas behind it accept them.
        argv.append("--trust-request-mm-kwargs")
    for key, value in given.items():
        argv += engine_arg_argv(key, value)
    argv += lora_argv(spec)
    argv += list(args.extra_args)
    return argv


@functools.lru_cache(maxsize=None)
def _has_flag(name: str) -> bool:
    """Does the installed vLLM's server take this flag? True where vLLM is not installed (the engine
    image decides). Read from the source of vLLM's server arguments, so nothing is imported."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return True
    cli_args = Path(list(spec.submodule_search_locations)[0]) / "entrypoints" / "launchers" / "cli_args.py"
    try:
        return name in cli_args.read_text(encoding="utf-8")
    except OSError:
        return True


def eager_by_default(spec: DeploymentSpec) -> bool:
    """The embedded model runs eagerly unless the spec says otherwise.

    On the CPU build, torch.compile adds 17-30 s of engine init to every start (vllm-cpu 0.32's
    AOT compile cache fails to reload), and the embedded model exists to prove the path quickly
    (demo, tests). Compiled decoding is faster (~1.4x, benchmarks/engine_start.py), so real
    models keep vLLM's default (compiled); `enforce_eager` in the spec overrides both.
    """
    return spec.model == EMBEDDED_MODEL


TRACE_FLUSH_MS = 200
"""OTEL_BSP_SCHEDULE_DELAY for an engine that exports traces to a bench (vLLM's default is 5000 ms):
spans reach the bench's receiver a fraction of a second after their request ends."""


def otlp_traces_endpoint(spec: DeploymentSpec) -> str | None:
    """The `--otlp-traces-endpoint` the spec gives vLLM (engine_args key or extra_args), if any."""
    value = spec.engine_args.vllm_flags().get("otlp_traces_endpoint")
    if value:
        return str(value)
    extra = list(spec.engine_args.extra_args)
    for index, item in enumerate(extra):
        if item == "--otlp-traces-endpoint" and index + 1 < len(extra):
            return extra[index + 1]
        if item.startswith("--otlp-traces-endpoint="):
            return item.split("=", 1)[1]
    return None


def tracing_env(spec: DeploymentSpec) -> dict[str, str]:
    """Environment for an engine exporting traces over OTLP/HTTP (an http(s) endpoint).

    vLLM speaks gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf; an http URL
    (what `vlmserve bench --engine-traces` listens on) needs the latter. The spec's own `env` wins.
    """
    endpoint = otlp_traces_endpoint(spec)
    if endpoint is None or not endpoint.startswith(("http://", "https://")):
        return {}
    return {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": str(TRACE_FLUSH_MS)}


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def plan_launches(spec: DeploymentSpec, model_path: str, device_kind: DeviceKind) -> list[EngineLaunch]:
    """One EngineLaunch per replica, with its port and its own devices."""
    ports = spec.replica_ports()
    common_env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1", **MEDIA_REDIRECTS_ENV}
    if spec.model == EMBEDDED_MODEL or Path(model_path).is_dir():
        # A local model needs no hub; don't let a missing network slow the start down.
        common_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    common_env.update(tracing_env(spec))
    if spec.lora_enabled and spec.gateway:
        # adapters loaded at run time through the gateway's admin route (gateway/adapter_admin.py); the
        # engines' own load path is reachable from the gateway alone (replicas listen on loopback behind it)
        common_env[RUNTIME_LORA_ENV] = "1"
    notes: list[str] = []
    if device_kind == "gpu":
        groups = gpu_groups(spec.replicas, spec.engine_args.tensor_parallel_size, gpu_count())
        device_env = [{"CUDA_VISIBLE_DEVICES": group} for group in groups]
    else:
        cpus = usable_cpus()
        groups = cpu_bind_groups(spec.replicas, spec.cpu_threads_per_replica, cpus)
        kv_gb = str(cpu_kv_cache_gb(spec))
        device_env = [{"VLLM_CPU_OMP_THREADS_BIND": group, "VLLM_CPU_KVCACHE_SPACE": kv_gb} for group in groups]
        if spec.engine_args.gpu_memory_utilization is not None:
            notes.append(
                "gpu_memory_utilization is not passed on CPU (it would reserve host memory); "
                "the KV cache is sized by kv_cache_space_gb"
            )
        if spec.replicas * (spec.cpu_threads_per_replica or 1) > len(cpus):
            notes.append(f"{spec.replicas} replicas share {len(cpus)} CPU core(s); expect them to be slow")
    launches = []
    for port, group, env in zip(ports, groups, device_env):
        launch_env = {**common_env, **env, **spec.env}
        launches.append(
            EngineLaunch(
                argv=engine_argv(spec, model_path, port, device_kind),
                env=launch_env,
                served_model_name=served_model_name(spec),
                model=model_path,
                port=port,
                devices=group,
                notes=notes,
            )
        )
    return launches


def model_weights_gb(model_path: str) -> float:
    """Size of the weight files of a local model (0 for a hub id we cannot see)."""
    path = Path(model_path)
    if not path.is_dir():
        return 0.0
    total = sum(item.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt") for item in path.glob(pattern))
    return total / 1e9


def host_memory_needed_gb(spec: DeploymentSpec, model_path: str, device_kind: DeviceKind) -> float:
    """Host memory all replicas need together, for the check before anything starts."""
    weights = model_weights_gb(model_path)
    if device_kind == "cpu":
        per_replica = CPU_ENGINE_OVERHEAD_GB + weights + cpu_kv_cache_gb(spec)
    else:
        per_replica = GPU_ENGINE_HOST_OVERHEAD_GB
    return per_replica * spec.replicas


def looks_like_path(model: str) -> bool:
    """'/x', './x', '~/x', 'x/' or an existing path are paths; 'org/name' is a hub id."""
    return model.startswith(("/", "./", "../", "~")) or model.endswith("/") or os.path.exists(model)


def resolve_model_path(model: str, on_event: EventSink | None = None) -> str:
    """The directory or hub id the engine loads; makes the embedded model on first use."""
    from vlmserve.engines.embedded import ensure_tiny_model, is_complete, tiny_model_path

    if model == EMBEDDED_MODEL:
        if not is_complete(tiny_model_path()) and on_event is not None:
            on_event("making the embedded tiny VLM (first use; a few seconds)")
        return str(ensure_tiny_model())
    if looks_like_path(model):
        path = Path(model).expanduser().resolve()
        if not path.exists():
            raise UserError(f"model path {path} does not exist; give a model directory or a hub id like org/name")
        if not path.is_dir() or not (path / "config.json").is_file():
            raise UserError(f"model path {path} has no config.json; point --model at a Hugging Face model directory")
        return str(path)
    return model


def model_expects_images(model: str, model_path: str) -> bool | None:
    """True for a VLM, False for a text-only model, None when we cannot tell before it starts."""
    if model == EMBEDDED_MODEL:
        return True
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
        except Exception:  # no hub library or a malformed id: decide after start
            cached = None
        if not isinstance(cached, str):
            return None
        config_file = Path(cached)
    try:
        config = loads_json(read_bytes(config_file, CONFIG_FILE), CONFIG_FILE)
    except (OSError, ValueError):  # unreadable, not JSON, or over the bounds (Refused): decide after start
        return None
    if not isinstance(config, dict):
        return None
    return "vision_config" in config or "vision_tower" in json.dumps(config)


def expected_cache_labels(spec: DeploymentSpec) -> dict[str, str]:
    """cache_config_info labels the spec pins down (compared after start)."""
    labels: dict[str, str] = {}
    if spec.engine_args.enable_prefix_caching is not None:
        labels["enable_prefix_caching"] = str(spec.engine_args.enable_prefix_caching)
    if spec.engine_args.kv_cache_dtype is not None:
        labels["cache_dtype"] = spec.engine_args.kv_cache_dtype
    return labels


@dataclass(frozen=True)
class VllmLauncher:
    """vLLM's answers to the EngineLauncher questions, for one spec, model path and device kind."""

    spec: DeploymentSpec
    model_path: str
    device_kind: DeviceKind
    module: str = VLLM_MODULE

    @classmethod
    def on_this_machine(cls, spec: DeploymentSpec, on_event: EventSink | None = None) -> "VllmLauncher":
        """Resolve the model here (made on first use for 'embedded'), check its LoRA adapters (made on
        first use for 'embedded:N'), lay its recipe under the spec's engine_args (unless `recipe: false`)
        and detect the devices."""
        from vlmserve.recipes.apply import spec_with_recipe

        model_path = resolve_model_path(spec.model, on_event=on_event)
        if spec.lora_modules:
            spec = spec.model_copy(update={"lora_modules": resolved_adapters(spec)})
        return cls(spec_with_recipe(spec, model_path, on_event), model_path, detect_device_kind(spec.devices))

    def arguments(self, *, host: str, port: int, index: int) -> list[str]:
        """vLLM's flags; every replica gets the same ones (its devices differ, through env)."""
        return engine_arguments(self.spec, self.model_path, port, self.device_kind, host)

    def launches(self) -> list[EngineLaunch]:
        return plan_launches(self.spec, self.model_path, self.device_kind)

    def expected(self) -> ExpectedConfig:
        return ExpectedConfig(
            served_model_name=served_model_name(self.spec),
            root=self.model_path,
            max_model_len=self.spec.engine_args.max_model_len,
            cache_config=expected_cache_labels(self.spec),
            expects_images=model_expects_images(self.spec.model, self.model_path),
            adapters=tuple(self.spec.lora_modules),
        )

    def host_memory_needed_gb(self) -> float:
        return host_memory_needed_gb(self.spec, self.model_path, self.device_kind)
