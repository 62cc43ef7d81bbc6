"""`vlmserve export kserve`: one KServe `LLMInferenceService` (serving.kserve.io/v1alpha2, the
version KServe v0.20 stores) for the spec.

KServe's own template runs `vllm serve /mnt/models --served-model-name <model.name> --port 8000
[--tensor-parallel-size <parallelism.tensor>] "$@"`, so the resource gives the model's URI and name,
`parallelism.tensor`, and the rest of the flags `vlmserve up` passes (recipe included) as the
`main` container's args, with the pod's CPU, memory and GPUs as `export k8s` sizes them. Routing
is KServe's llm-d scheduler, configured inline with the same EndpointPickerConfig that
`export k8s --router llm-d` writes. The autoscaling rule's bounds and HPA behaviour go to
`scaling` (KServe's Workload Variant Autoscaler with the HPA actuator); the trigger itself is
WVA's saturation model, so the rule's queue threshold and polling interval are not carried (a
warning says so), as nothing of vlmserve's gateway is (platform_engine.ALWAYS_LEFT_BEHIND).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vlmserve.engines.launcher import served_model_name
from vlmserve.errors import UserError
from vlmserve.export.k8s import (
    K8sOptions,
    _is_local_path,
    _labels,
    _meta,
    autoscale_rule,
    check_options,
    engine_resources,
    hpa_behavior,
    startup_budget,
)
from vlmserve.export.llmd import endpoint_picker_config, policy_note
from vlmserve.export.platform_engine import comment_block, platform_engine, without_flags
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.spec import DeploymentSpec

LLMISVC_API = "serving.kserve.io/v1alpha2"
KSERVE = "KServe v0.20"
KSERVE_MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts the model its template serves
MAIN_CONTAINER = "main"  # the container KServe's template fills in
TEMPLATE_FLAGS = ("--served-model-name", "--tensor-parallel-size")  # KServe's template writes these from the spec


@dataclass
class ResourceExport:
    """The resource, its comment header, and what to print."""

    resource: JSONObject
    header: str
    notes: list[str] = field(default_factory=list)


def model_uri(spec: DeploymentSpec, options: K8sOptions) -> str:
    """`hf://<id>` for a Hugging Face model; `pvc://<claim>/<folder>` for a weights folder on --model-pvc."""
    if not _is_local_path(spec.model):
        return f"hf://{spec.model}"
    if not options.model_pvc:
        raise UserError(
            f"model '{spec.model}' is a local folder; copy it to a PersistentVolumeClaim "
            "and pass --model-pvc NAME (KServe reads it as pvc://NAME/<folder name>)"
        )
    return f"pvc://{options.model_pvc}/{Path(spec.model).expanduser().name}"


def scaling(spec: DeploymentSpec, options: K8sOptions, notes: list[str]) -> JSONObject:
    """The rule's bounds and HPA behaviour, for WVA's HPA actuator."""
    rule = autoscale_rule(spec, options)
    notes.append(
        f"warning: kserve: the autoscaling trigger ({rule.waiting_per_replica:g} waiting requests per "
        f"replica, read every {rule.polling_interval_s}s) is not carried: {KSERVE}'s autoscaler "
        "(WVA) scales on its own saturation model; the bounds and scaling behaviour are carried"
    )
    return {"minReplicas": rule.min_replicas, "maxReplicas": rule.max_replicas, "wva": {"hpa": {"behavior": hpa_behavior(rule)}}}


def export_kserve(spec: DeploymentSpec, options: K8sOptions, *, drop_gateway_settings: bool) -> ResourceExport:
    """The LLMInferenceService for the spec, and every warning; checks run before anything is built."""
    check_options(options)
    engine = platform_engine(spec, KSERVE_MODEL_DIR, "kserve", drop_gateway_settings=drop_gateway_settings)
    uri = model_uri(spec, options)
    engine.notes += policy_note(spec.gateway_policy, "kserve")
    container: JSONObject = {
        "name": MAIN_CONTAINER,
        "image": options.vllm_image,
        "args": [*without_flags(engine.args, TEMPLATE_FLAGS)],
        "resources": engine_resources(engine.spec),
        # KServe merges this into its template's probe (by container name): only the budget
        "startupProbe": {**startup_budget(spec.ready_timeout_s)},
    }
    env: list[JSONValue] = [{"name": key, "value": value} for key, value in sorted(spec.env.items())]
    if options.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": options.hf_token_secret, "key": "token"}}})
    if env:
        container["env"] = env
    body: JSONObject = {
        "model": {"uri": uri, "name": served_model_name(engine.spec)},
        "scaling": scaling(spec, options, engine.notes),  # KServe takes replicas or scaling, not both
        "router": {"route": {}, "gateway": {}, "scheduler": {"config": {"inline": endpoint_picker_config(spec.gateway_policy)}}},
        "template": {"containers": [container]},
    }
    tp = spec.engine_args.tensor_parallel_size
    if tp > 1:
        body["parallelism"] = {"tensor": tp}
    resource: JSONObject = {
        "apiVersion": LLMISVC_API,
        "kind": "LLMInferenceService",
        "metadata": _meta(spec.name, options, _labels(spec, "engine")),
        "spec": body,
    }
    header = comment_block(
        f"vlmserve export kserve: {spec.name}, an LLMInferenceService for {KSERVE}; apply with: kubectl apply -f <this file>",
        engine.left_behind,
    )
    return ResourceExport(resource=resource, header=header, notes=engine.notes)
