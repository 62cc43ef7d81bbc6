"""`vlmserve export production-stack`: Helm values for vllm-project/production-stack's `vllm-stack` chart.

One `servingEngineSpec.modelSpec` entry carries the engine: the model, the replica count, the
pod's CPU, memory and GPUs (as `export k8s` sizes them), the vLLM flags `vlmserve up` passes with
the recipe (the ones the chart has a `vllmConfig` key for go there, since the chart writes those
flags itself; the rest in `vllmConfig.extraArgs`), and the autoscaling rule as the chart's KEDA
settings. `routerSpec.routingLogic` is the nearest of the chart's router policies.

What the chart cannot take is said, on stderr and at the top of the values file:
- the KEDA threshold: the chart's schema (vllm-stack 0.1.12) types `keda.triggers` as one object
  while its template writes that value where KEDA wants a list, so a custom trigger would render a
  ScaledObject KEDA refuses; the export keeps the chart's own trigger (`vllm:num_requests_waiting`,
  threshold 5, vlmserve's default too) and warns when the rule's threshold differs;
- everything vlmserve's gateway did (platform_engine.ALWAYS_LEFT_BEHIND).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmserve import routing
from vlmserve.errors import UserError
from vlmserve.export.k8s import (
    K8sOptions,
    _is_local_path,
    _model_location,
    autoscale_rule,
    check_options,
    engine_requests,
    hpa_behavior,
    startup_budget,
)
from vlmserve.export.platform_engine import comment_block, flag_value, platform_engine, without_flags
from vlmserve.json_types import JSONObject
from vlmserve.spec import DeploymentSpec

CHART = "vllm-stack 0.1.12 (github.com/vllm-project/production-stack)"
CHART_TRIGGER_THRESHOLD = 5.0  # the chart's default KEDA trigger: vllm:num_requests_waiting > 5 per replica
VLLM_DEFAULT_PREFIX_CACHING = True  # the chart writes --no-enable-prefix-caching unless told: keep vLLM's default

ROUTING_LOGIC: dict[str, tuple[str, str]] = {
    routing.ROUND_ROBIN: ("roundrobin", ""),
    routing.PREFIX_AFFINITY: ("prefixaware", ""),
    routing.IMAGE_AFFINITY: ("prefixaware", "the router matches the prompt's prefix, not the images' digests"),
    routing.LEAST_OUTSTANDING_TOKENS: ("roundrobin", "the chart's router has no load-aware policy without LMCache"),
    routing.ENGINE_AWARE: ("roundrobin", "the chart's router has no load-aware policy without LMCache"),
    routing.ADAPTER_AFFINITY: (
        "roundrobin",
        "the router sends each adapter's name to the engines serving it, with no affinity among them",
    ),
}
"""vlmserve's gateway policies as the chart's `routerSpec.routingLogic` (and how each differs)."""

_VLLM_CONFIG: dict[str, tuple[str, type[int] | type[float] | type[str]]] = {
    "--tensor-parallel-size": ("tensorParallelSize", int),
    "--max-model-len": ("maxModelLen", int),
    "--max-num-seqs": ("maxNumSeqs", int),
    "--dtype": ("dtype", str),
    "--gpu-memory-utilization": ("gpuMemoryUtilization", float),
}
"""Flags the chart writes itself from a vllmConfig key: given as that key, never twice."""
_PREFIX_CACHING = ("--enable-prefix-caching", "--no-enable-prefix-caching")


@dataclass
class ValuesExport:
    """The values (one YAML document), its comment header, and what to print."""

    values: JSONObject
    header: str
    notes: list[str] = field(default_factory=list)


def image_parts(image: str) -> tuple[str, str]:
    """(repository, tag) of an image reference, as the chart takes it; a digest it cannot take."""
    if "@" in image:
        raise UserError(f"--vllm-image {image}: the chart takes repository and tag, not a digest; give a tag")
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    return name, tag


def vllm_config(args: list[str]) -> JSONObject:
    """The chart's vllmConfig from the engine's flags: its own keys where it has one, the rest as extraArgs."""
    config: JSONObject = {}
    for flag, (key, kind) in _VLLM_CONFIG.items():
        value = flag_value(args, flag)
        if value is not None:
            config[key] = kind(value)
    config["enablePrefixCaching"] = (
        (_PREFIX_CACHING[1] not in args) if any(f in args for f in _PREFIX_CACHING) else VLLM_DEFAULT_PREFIX_CACHING
    )
    extra = [item for item in without_flags(args, tuple(_VLLM_CONFIG)) if item not in _PREFIX_CACHING]
    if extra:
        config["extraArgs"] = [*extra]
    return config


def keda_values(spec: DeploymentSpec, options: K8sOptions, notes: list[str]) -> JSONObject:
    """The autoscaling rule in the chart's per-model KEDA keys (bounds, polling, HPA behaviour)."""
    rule = autoscale_rule(spec, options)
    if rule.waiting_per_replica != CHART_TRIGGER_THRESHOLD:
        notes.append(
            f"warning: production-stack: the autoscaling threshold {rule.waiting_per_replica:g} waiting "
            f"requests per replica is not carried: {CHART} scales at {CHART_TRIGGER_THRESHOLD:g} (its "
            "values schema and template disagree on keda.triggers)"
        )
    return {
        "enabled": True,
        "minReplicaCount": rule.min_replicas,
        "maxReplicaCount": rule.max_replicas,
        "pollingInterval": rule.polling_interval_s,
        "cooldownPeriod": rule.scale_down_cooldown_s,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": hpa_behavior(rule)}},
    }


def model_spec(spec: DeploymentSpec, options: K8sOptions, args: list[str], notes: list[str]) -> JSONObject:
    """The one servingEngineSpec.modelSpec entry for the spec's engine."""
    model, volumes, mounts = _model_location(spec, options)
    repository, tag = image_parts(options.vllm_image)
    requests = engine_requests(spec)
    entry: JSONObject = {
        "name": spec.name,
        "repository": repository,
        "tag": tag,
        "modelURL": model,
        "replicaCount": spec.replicas,
        "requestCPU": int(requests["cpu"]),
        "requestMemory": requests["memory"],
        "requestGPU": 0 if spec.devices == "cpu" else spec.engine_args.tensor_parallel_size,
        "shmSize": options.shm_size,
        "vllmConfig": vllm_config(args),
        "keda": keda_values(spec, options, notes),
    }
    if _is_local_path(spec.model):  # the weights folder on its claim, where the flags expect it
        entry["extraVolumes"], entry["extraVolumeMounts"] = volumes, mounts
    if spec.env:
        entry["env"] = [{"name": key, "value": value} for key, value in sorted(spec.env.items())]
    if options.hf_token_secret:
        entry["hf_token"] = {"secretName": options.hf_token_secret, "secretKey": "token"}
    return entry


def export_production_stack(spec: DeploymentSpec, options: K8sOptions, *, drop_gateway_settings: bool) -> ValuesExport:
    """The chart's values for the spec, and every warning; checks run before anything is built."""
    check_options(options)
    model, _, _ = _model_location(spec, options)
    engine = platform_engine(spec, model, "production-stack", drop_gateway_settings=drop_gateway_settings)
    policy = routing.POLICY_ALIASES.get(spec.gateway_policy, spec.gateway_policy)
    if policy not in ROUTING_LOGIC:
        raise UserError(
            f"gateway_policy {policy!r} has no production-stack router equivalent; choose one of {', '.join(ROUTING_LOGIC)}"
        )
    logic, differs = ROUTING_LOGIC[policy]
    if differs:
        engine.notes.append(f"warning: production-stack: gateway_policy {policy} becomes routingLogic {logic}: {differs}")
    values: JSONObject = {
        # the model-load budget (the chart's probe is one for all models; Helm keeps its other keys)
        "servingEngineSpec": {
            "startupProbe": {**startup_budget(spec.ready_timeout_s)},
            "modelSpec": [model_spec(engine.spec, options, engine.args, engine.notes)],
        },
        "routerSpec": {"routingLogic": logic},
    }
    header = comment_block(
        f"vlmserve export production-stack: {spec.name}, Helm values for {CHART}; "
        f"install with: helm install {spec.name} vllm/vllm-stack -f <this file>",
        engine.left_behind,
    )
    return ValuesExport(values=values, header=header, notes=engine.notes)
