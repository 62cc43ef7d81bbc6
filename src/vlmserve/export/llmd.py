"""`vlmserve export k8s --router llm-d`: the engines behind the Gateway API Inference Extension
instead of vlmserve's gateway.

llm-d (and any Gateway API implementation with the Inference Extension) routes to an
InferencePool: a label selector over the engine pods plus an endpoint picker (EPP) that the
Gateway asks, per request, which pod to use. So this output has no vlmserve gateway and no Redis:

- the engine Deployment (the same `vllm serve` flags as `vlmserve up`, recipe included) whose pod
  labels are the pool's selector, its headless Service (Prometheus and KEDA read the engines through it);
- an InferencePool (`inference.networking.k8s.io/v1`, the API the extension publishes since v1.0);
- the EPP: a ServiceAccount allowed to read pods and InferencePools, a ConfigMap with its
  EndpointPickerConfig (vlmserve's routing policy mapped to the nearest scorers), a Deployment and
  a Service on its ext-proc port;
- an HTTPRoute from the operator's Gateway to the pool;
- the autoscaling rule as a KEDA ScaledObject and a ServiceMonitor, as `--router vlmserve` writes them.

The EPP configuration is written as `inference.networking.x-k8s.io/v1alpha1`: the version the
extension's own EPP reads and that llm-d's EPP still accepts (as a deprecated alias of
`llm-d.ai/v1alpha1`); the llm-d chart and KServe write it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve import routing
from vlmserve.errors import UserError
from vlmserve.export.k8s import (
    CONTAINER_PORT,
    K8sExport,
    K8sOptions,
    _at,
    _labels,
    _meta,
    check_options,
    engine_deployment,
    engine_name,
    engine_service,
    scaled_object,
    service_monitor,
)
from vlmserve.export.k8s_security import check_dns_label
from vlmserve.export.platform_engine import (
    LIMIT_MM_FLAG,
    cap_images,
    check_platform_spec,
    comment_block,
    gateway_off,
    left_behind,
)
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.observe.pack import to_yaml
from vlmserve.spec import DeploymentSpec

ROUTERS = ("vlmserve", "llm-d")
INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_API = f"{INFERENCE_GROUP}/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
HTTP_ROUTE_API = f"{GATEWAY_GROUP}/v1"
EPP_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"
EPP_CONFIG_KIND = "EndpointPickerConfig"
EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.9.0"  # the EPP KServe v0.20 pins
EPP_GRPC_PORT = 9002  # ext-proc: the Gateway asks the EPP here
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
EPP_CONFIG_MOUNT = "/config"
EPP_CONFIG_FILE = "epp-config.yaml"
EPP_FAILURE_MODE = "FailOpen"  # a down EPP must not take the service down: the Gateway then picks a pod itself
GATEWAY_NAME = "inference-gateway"  # the name the extension's guides give the Gateway
ROUTE_TIMEOUT = "0s"  # Gateway API: no limit on a whole request, as vlmserve's gateway (long streams are not cut)


@dataclass(frozen=True)
class LlmdOptions:
    """What the llm-d target needs beyond K8sOptions."""

    epp_image: str = EPP_IMAGE
    gateway_name: str = GATEWAY_NAME
    drop_gateway_settings: bool = False


@dataclass(frozen=True)
class Scorers:
    """The EPP plugins nearest one vlmserve routing policy: weighted scorers, then a picker."""

    scorers: tuple[tuple[str, float], ...]
    picker: str
    exact: bool  # False: the nearest, not the same; the export says how it differs
    differs: str = ""


_LOAD = (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2))
POLICY_SCORERS: dict[str, Scorers] = {
    routing.ROUND_ROBIN: Scorers((), "random-picker", False, "the EPP picks at random (no round-robin picker)"),
    routing.LEAST_OUTSTANDING_TOKENS: Scorers(
        _LOAD,
        "max-score-picker",
        False,
        "the EPP scores the engines' reported queue and KV-cache use, not the tokens vlmserve charges at dispatch",
    ),
    routing.ENGINE_AWARE: Scorers(_LOAD, "max-score-picker", True),
    routing.PREFIX_AFFINITY: Scorers((("prefix-cache-scorer", 3), *_LOAD), "max-score-picker", True),
    routing.IMAGE_AFFINITY: Scorers(
        (("prefix-cache-scorer", 3), *_LOAD),
        "max-score-picker",
        False,
        "the EPP's prefix-cache scorer hashes the prompt, not the images' content digests",
    ),
    routing.ADAPTER_AFFINITY: Scorers((("lora-affinity-scorer", 3), *_LOAD), "max-score-picker", True),
}
"""vlmserve's gateway policies as EPP scorers (plugin types registered by the EPP; weights as the
llm-d chart's defaults: prefix 3, queue 2, KV cache 2)."""


def policy_scorers(policy: str) -> Scorers:
    policy = routing.POLICY_ALIASES.get(policy, policy)
    if policy not in POLICY_SCORERS:
        raise UserError(f"gateway_policy {policy!r} has no endpoint-picker equivalent; choose one of {', '.join(POLICY_SCORERS)}")
    return POLICY_SCORERS[policy]


def policy_note(policy: str, platform: str) -> list[str]:
    """A warning when the policy's EPP form is only the nearest one."""
    chosen = policy_scorers(policy)
    if chosen.exact:
        return []
    return [
        f"warning: {platform}: gateway_policy {policy} becomes "
        f"{', '.join(name for name, _ in chosen.scorers) or chosen.picker}: {chosen.differs}"
    ]


def endpoint_picker_config(policy: str) -> JSONObject:
    """The EPP's plugin configuration for a vlmserve routing policy (one scheduling profile)."""
    chosen = policy_scorers(policy)
    scorers: list[JSONValue] = [{"type": name} for name, _ in chosen.scorers]
    weights: list[JSONValue] = [{"pluginRef": name, "weight": weight} for name, weight in chosen.scorers]
    plugins: list[JSONValue] = [{"type": "single-profile-handler"}, *scorers, {"type": chosen.picker}]
    profile: list[JSONValue] = [*weights, {"pluginRef": chosen.picker}]
    return {
        "apiVersion": EPP_CONFIG_API,
        "kind": EPP_CONFIG_KIND,
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
    }


def pool_name(spec: DeploymentSpec) -> str:
    return spec.name


def epp_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-epp"


def inference_pool(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    """The engine pods (by the engine Deployment's pod labels) and the EPP that picks among them."""
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": _meta(pool_name(spec), options, _labels(spec, "engine")),
        "spec": {
            "selector": {"matchLabels": {**_labels(spec, "engine")}},
            "targetPorts": [{"number": CONTAINER_PORT}],
            "endpointPickerRef": {
                "name": epp_name(spec),
                "kind": "Service",
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": EPP_FAILURE_MODE,
            },
        },
    }


def epp_objects(spec: DeploymentSpec, options: K8sOptions, llmd: LlmdOptions) -> dict[str, JSONObject]:
    """The endpoint picker: may read pods and InferencePools in the namespace, nothing else."""
    name, labels = epp_name(spec), _labels(spec, "endpoint-picker")
    return {
        "epp-serviceaccount.yaml": {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, options, labels)},
        "epp-role.yaml": _epp_role(name, options, labels),
        "epp-rolebinding.yaml": _epp_role_binding(name, options, labels),
        "epp-configmap.yaml": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(name, options, labels),
            "data": {EPP_CONFIG_FILE: to_yaml(endpoint_picker_config(spec.gateway_policy))},
        },
        "epp-deployment.yaml": _epp_deployment(name, options, labels, _epp_container(spec, options, llmd)),
        "epp-service.yaml": _epp_service(name, options, labels),
    }


def _epp_container(spec: DeploymentSpec, options: K8sOptions, llmd: LlmdOptions) -> JSONObject:
    """The EPP container: watches the pool, reads its configuration from the mounted ConfigMap."""
    return {
        "name": "epp",
        "image": llmd.epp_image,
        "args": [
            "--pool-name",
            pool_name(spec),
            "--pool-namespace",
            options.namespace,
            "--pool-group",
            INFERENCE_GROUP,
            "--config-file",
            f"{EPP_CONFIG_MOUNT}/{EPP_CONFIG_FILE}",
            "--zap-encoder",
            "json",
        ],
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "livenessProbe": {
            "grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
        },
        "readinessProbe": {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "epp-config", "mountPath": EPP_CONFIG_MOUNT, "readOnly": True}],
    }


def _epp_role(name: str, options: K8sOptions, labels: dict[str, str]) -> JSONObject:
    """Read access to pods and the extension's objects in the namespace: what the EPP watches."""
    read: list[JSONValue] = ["get", "list", "watch"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, options, labels),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": [INFERENCE_GROUP], "resources": ["inferencepools"], "verbs": read},
            {
                "apiGroups": ["inference.networking.x-k8s.io"],
                "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                "verbs": read,
            },
        ],
    }


def _epp_role_binding(name: str, options: K8sOptions, labels: dict[str, str]) -> JSONObject:
    """The Role bound to the EPP's ServiceAccount."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(name, options, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": options.namespace}],
    }


def _epp_deployment(name: str, options: K8sOptions, labels: dict[str, str], container: JSONObject) -> JSONObject:
    """One EPP pod: its prefix-cache view is in memory, and Recreate never runs two at once."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, options, labels),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {**labels}},
            "template": {
                "metadata": {"labels": {**labels}},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": 130,
                    "containers": [container],
                    "volumes": [{"name": "epp-config", "configMap": {"name": name}}],
                },
            },
        },
    }


def _epp_service(name: str, options: K8sOptions, labels: dict[str, str]) -> JSONObject:
    """The EPP's ext-proc port (the InferencePool points here) and its metrics port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, options, labels),
        "spec": {
            "selector": {**labels},
            "type": "ClusterIP",
            "ports": [
                {"name": "grpc-ext-proc", "port": EPP_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "http-metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def http_route(spec: DeploymentSpec, options: K8sOptions, llmd: LlmdOptions) -> JSONObject:
    """Every path on the operator's Gateway to the pool (the EPP picks the pod)."""
    return {
        "apiVersion": HTTP_ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": _meta(spec.name, options, _labels(spec, "route")),
        "spec": {
            "parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": llmd.gateway_name}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [{"group": INFERENCE_GROUP, "kind": "InferencePool", "name": pool_name(spec)}],
                    "timeouts": {"request": ROUTE_TIMEOUT},
                }
            ],
        },
    }


def _engine(spec: DeploymentSpec, options: K8sOptions, notes: list[str]) -> JSONObject:
    """The engine Deployment with its gateway off and the image-count limit in vLLM's own flag."""
    deployment = engine_deployment(gateway_off(spec), options, notes)
    container = _at(deployment, "spec", "template", "spec", "containers", 0)
    args = _at(container, "args")
    if spec.engine == "vllm" and isinstance(container, dict) and isinstance(args, list):  # as engine_deployment builds it
        container["args"] = [*cap_images([str(item) for item in args], spec.max_images_per_request)]
    elif spec.max_images_per_request is not None:
        notes.append(f"warning: llm-d: max_images_per_request is not enforced by the sim engine ({LIMIT_MM_FLAG})")
    return deployment


def export_llmd(spec: DeploymentSpec, options: K8sOptions, llmd: LlmdOptions) -> K8sExport:
    """Everything `export k8s --router llm-d` writes and says; every check runs before anything is built."""
    check_options(options)
    check_dns_label("--gateway-name", llmd.gateway_name)
    found = K8sExport(notes=check_platform_spec(spec, "llm-d", llmd.drop_gateway_settings))
    found.notes += policy_note(spec.gateway_policy, "llm-d")
    found.notes.append(
        "warning: llm-d: the engine pods take connections from any pod in the cluster (the "
        "Gateway's proxy pods are your implementation's); add a NetworkPolicy for them"
    )
    found.manifests["engine-deployment.yaml"] = _engine(spec, options, found.notes)
    found.manifests["engine-service.yaml"] = engine_service(spec, options)
    found.manifests["inferencepool.yaml"] = inference_pool(spec, options)
    found.manifests.update(epp_objects(spec, options, llmd))
    found.manifests["httproute.yaml"] = http_route(spec, options, llmd)
    found.manifests["engine-scaledobject.yaml"] = scaled_object(spec, options)
    found.manifests["servicemonitor.yaml"] = service_monitor(gateway_off(spec), options)
    header = comment_block(
        f"vlmserve export k8s --router llm-d: {spec.name} ({engine_name(spec)} behind InferencePool {pool_name(spec)})",
        left_behind(spec),
    )
    found.comments = {"inferencepool.yaml": header, "httproute.yaml": header}
    return found
