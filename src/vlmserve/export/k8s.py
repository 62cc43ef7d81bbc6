"""Kubernetes manifests from a DeploymentSpec: the same deployment, beyond one machine.

One engine Deployment for the replica group (GPU requests = tensor-parallel size, probes
sized for model load, /dev/shm in memory), its Service, the gateway Deployment and Service,
a KEDA ScaledObject scaling on the engines' queue, and a ServiceMonitor plus PrometheusRule
carrying the observability pack's alerts so Kubernetes and `vlmserve up` alert alike.

The gateway sees every engine pod, not one Service address, so it balances, ejects and drains
pods one by one and sees the pods KEDA adds: the engine Service is headless and the gateway
discovers its pods (`--discover dns:` on the Service's records by default; `--discovery k8s`
reads its EndpointSlices instead, with a ServiceAccount, Role and RoleBinding allowing just
that). Two gateway replicas (spread over nodes) share admission state through a Redis
Deployment and Service (`--state redis://...`, failing open when Redis is unreachable, so an
outage of the limiter never takes the service down).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from vlmserve.autoscale import AutoscaleRule
from vlmserve.engines.launcher import make_launcher
from vlmserve.errors import UserError
from vlmserve.gateway.shared_state import STATE_FLAG, STATE_UNAVAILABLE_FLAG
from vlmserve.observe.alerts import AlertSettings, alert_rules
from vlmserve.observe.queries import DEPLOYMENT_LABEL, ENGINE_JOB, GATEWAY_JOB
from vlmserve.spec import EMBEDDED_MODEL, DeploymentSpec

CONTAINER_PORT = 8000
JOB_LABEL = "vlmserve.io/job"
MODEL_MOUNT = "/models"
STARTUP_PROBE_PERIOD_S = 10
GATEWAY_REPLICAS = 2
REDIS_PORT = 6379
DISCOVERY_KINDS = ("dns", "k8s")
STATE_UNAVAILABLE = "open"  # an outage of the limiter must not take the service down


@dataclass(frozen=True)
class K8sOptions:
    """What a cluster needs that a one-machine DeploymentSpec does not say."""

    namespace: str = "default"
    vllm_image: str = "vllm/vllm-openai:latest"
    vlmserve_image: str = "vlmserve:0.1.0"
    model_pvc: str | None = None
    hf_token_secret: str | None = None
    max_replicas: int | None = None
    waiting_per_replica: float | None = None  # None: the spec's autoscale rule (or its default)
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    monitoring_labels: tuple[tuple[str, str], ...] = ()
    shm_size: str = "8Gi"
    discovery: str = "dns"  # how the gateway finds the engine pods: dns (headless Service) or k8s (EndpointSlices)
    redis_image: str = "redis:7-alpine"


def _labels(spec: DeploymentSpec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vlmserve", "app.kubernetes.io/instance": spec.name,
            "app.kubernetes.io/component": component}


def _meta(name: str, options: K8sOptions, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": options.namespace, "labels": labels}


def engine_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-engine"


def gateway_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-gateway"


def redis_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-redis"


def _is_local_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def _model_location(spec: DeploymentSpec, options: K8sOptions) -> tuple[str, list[dict], list[dict]]:
    """(model argument inside the pod, volumes, volume mounts) for the engine container."""
    if spec.engine == "sim":
        return spec.model, [], []
    if spec.model == EMBEDDED_MODEL:
        raise UserError("model 'embedded' is the tiny test model that exists only on this machine; "
                        "set model: to a Hugging Face id or a weights folder (with --model-pvc)")
    if _is_local_path(spec.model):
        if not options.model_pvc:
            raise UserError(f"model '{spec.model}' is a local folder; copy it to a PersistentVolumeClaim "
                            "and pass --model-pvc NAME (it is mounted at /models/<folder name>)")
        in_pod = str(PurePosixPath(MODEL_MOUNT) / Path(spec.model).expanduser().name)
        return (in_pod,
                [{"name": "models", "persistentVolumeClaim": {"claimName": options.model_pvc, "readOnly": True}}],
                [{"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True}])
    cache = [{"name": "hf-cache", "emptyDir": {}}], [{"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}]
    return spec.model, cache[0], cache[1]


def _probes(ready_timeout_s: float) -> dict[str, Any]:
    """Startup budget covers model load (the spec's ready timeout); after that, quick checks."""
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "startupProbe": {**health, "periodSeconds": STARTUP_PROBE_PERIOD_S, "timeoutSeconds": 5,
                         "failureThreshold": max(1, math.ceil(ready_timeout_s / STARTUP_PROBE_PERIOD_S))},
        "readinessProbe": {**health, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def _gateway_probes() -> dict[str, Any]:
    """Ready while some engine pod is routable (/health); alive while the process answers (/metrics).

    Liveness must not follow the engines: while they load a model for minutes, or all restart, a
    gateway restarted for it would only lose its state and connections."""
    return {
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 5,
                           "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/metrics", "port": "http"}, "initialDelaySeconds": 10,
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def _env(spec: DeploymentSpec, options: K8sOptions) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in sorted(spec.env.items())]
    if options.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": options.hf_token_secret,
                                                                       "key": "token"}}})
    return env


def engine_container_command(spec: DeploymentSpec, model: str) -> tuple[list[str], list[str]]:
    """(command, args) of the engine container: the flags `vlmserve up` passes, from the same
    EngineLauncher, listening on the pod's network; the image's program replaces this machine's."""
    launcher = make_launcher(spec, model_path=model, device_kind="cpu" if spec.devices == "cpu" else "gpu")
    args = launcher.arguments(host="0.0.0.0", port=CONTAINER_PORT, index=0)
    command = ["vlmserve"] if spec.engine == "sim" else ["python3", "-m", launcher.module]
    return command, args


def _engine_container(spec: DeploymentSpec, options: K8sOptions, model: str, mounts: list[dict]) -> dict:
    command, args = engine_container_command(spec, model)
    resources: dict[str, Any]
    if spec.engine == "sim":
        image = options.vlmserve_image
        resources = {"requests": {"cpu": "500m", "memory": "512Mi"}}
    else:
        image = options.vllm_image
        tp = spec.engine_args.tensor_parallel_size
        if spec.devices == "cpu":
            resources = {"requests": {"cpu": str(4 * tp), "memory": f"{16 * tp}Gi"}}
        else:
            gpus = {"nvidia.com/gpu": str(tp)}
            resources = {"requests": {**gpus, "cpu": str(4 * tp), "memory": f"{16 * tp}Gi"}, "limits": gpus}
    return {
        "name": "engine", "image": image, "command": command, "args": args,
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "env": _env(spec, options), "resources": resources, **_probes(spec.ready_timeout_s),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *mounts],
    }


def engine_deployment(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    """The replica group as one Deployment (replicas = spec.replicas)."""
    model, volumes, mounts = _model_location(spec, options)
    labels = _labels(spec, "engine")
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 60,
        "containers": [_engine_container(spec, options, model, mounts)],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}}, *volumes],
    }
    if spec.engine == "vllm" and spec.devices != "cpu":
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(engine_name(spec), options, labels),
        "spec": {"replicas": spec.replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


def _service(name: str, spec: DeploymentSpec, options: K8sOptions, component: str, job: str,
             port: int, headless: bool = False) -> dict[str, Any]:
    selector = _labels(spec, component)
    service_spec: dict[str, Any] = {"selector": selector,
                                    "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}
    if headless:
        service_spec["clusterIP"] = "None"
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(name, options, {**selector, JOB_LABEL: job}),
        "spec": service_spec,
    }


def engine_service(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    """Headless: its DNS name resolves to every ready engine pod (and its EndpointSlices list them),
    which is how the gateway finds them; Prometheus scrapes the same endpoints."""
    return _service(engine_name(spec), spec, options, "engine", ENGINE_JOB, CONTAINER_PORT, headless=True)


def discover_source(spec: DeploymentSpec, options: K8sOptions) -> str:
    """The gateway's --discover value for the engine pods."""
    if options.discovery == "k8s":
        return f"k8s:{options.namespace}/{engine_name(spec)}:http"
    return f"dns:{engine_name(spec)}.{options.namespace}.svc.cluster.local:{CONTAINER_PORT}"


def redis_url(spec: DeploymentSpec, options: K8sOptions) -> str:
    return f"redis://{redis_name(spec)}.{options.namespace}.svc:{REDIS_PORT}/0"


def gateway_deployment(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    """Two gateways on different nodes where possible, each discovering the engine pods and sharing
    admission through Redis (failing open if Redis is unreachable)."""
    labels = _labels(spec, "gateway")
    container = {
        "name": "gateway", "image": options.vlmserve_image, "command": ["vlmserve"],
        "args": ["gateway", "--host", "0.0.0.0", "--port", str(CONTAINER_PORT),
                 "--discover", discover_source(spec, options), "--policy", spec.gateway_policy,
                 STATE_FLAG, redis_url(spec, options), STATE_UNAVAILABLE_FLAG, STATE_UNAVAILABLE],
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        **_gateway_probes(),
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": labels},
                                               "topologyKey": "kubernetes.io/hostname"}}]}},
    }
    if options.discovery == "k8s":
        pod_spec["serviceAccountName"] = gateway_name(spec)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(gateway_name(spec), options, labels),
        "spec": {"replicas": GATEWAY_REPLICAS, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


def gateway_rbac(spec: DeploymentSpec, options: K8sOptions) -> dict[str, dict[str, Any]]:
    """`--discovery k8s`: the gateway's ServiceAccount may list and watch EndpointSlices in its namespace, nothing else."""
    labels = _labels(spec, "gateway")
    name = gateway_name(spec)
    return {
        "gateway-serviceaccount.yaml": {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": _meta(name, options, labels)},
        "gateway-role.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, options, labels),
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["get", "list", "watch"]}],
        },
        "gateway-rolebinding.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(name, options, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": options.namespace}],
        },
    }


def redis_deployment(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    """The gateways' shared admission state: rate-limit buckets that may be lost on restart (no persistence)."""
    labels = _labels(spec, "redis")
    ping = {"exec": {"command": ["redis-cli", "ping"]}}
    container = {
        "name": "redis", "image": options.redis_image,
        "args": ["--save", "", "--appendonly", "no"],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "readinessProbe": {**ping, "periodSeconds": 5, "timeoutSeconds": 2},
        "livenessProbe": {**ping, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 6},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(redis_name(spec), options, labels),
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}},
    }


def redis_service(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    labels = _labels(spec, "redis")
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(redis_name(spec), options, labels),
        "spec": {"selector": labels,
                 "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}]},
    }


def gateway_service(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    return _service(gateway_name(spec), spec, options, "gateway", GATEWAY_JOB, spec.port)


def autoscale_rule(spec: DeploymentSpec, options: K8sOptions) -> AutoscaleRule:
    """The rule KEDA runs: the spec's `autoscale:` (the one `up --autoscale` runs), else the
    spec's replica count as the floor; `--max-replicas` and `--waiting-per-replica` override."""
    rule = spec.autoscale or AutoscaleRule(min_replicas=spec.replicas, max_replicas=max(spec.replicas * 4, spec.replicas + 1))
    updates: dict[str, Any] = {}
    if options.max_replicas is not None:
        updates["max_replicas"] = options.max_replicas
    if options.waiting_per_replica is not None:
        updates["waiting_per_replica"] = options.waiting_per_replica
    if updates.get("max_replicas", rule.max_replicas) < rule.min_replicas:
        where = "autoscale.min_replicas" if spec.autoscale else "replicas"
        raise UserError(f"--max-replicas {options.max_replicas} is below {where}: {rule.min_replicas} in the spec; raise it")
    return AutoscaleRule.model_validate({**rule.model_dump(), **updates}) if updates else rule


def keda_scaled_object_spec(rule: AutoscaleRule, query: str, prometheus_url: str, target: str) -> dict[str, Any]:
    """A ScaledObject's spec carrying `rule` field for field (rule_from_keda reads it back)."""
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "minReplicaCount": rule.min_replicas,
        "maxReplicaCount": rule.max_replicas,
        "pollingInterval": rule.polling_interval_s,
        "cooldownPeriod": rule.scale_down_cooldown_s,  # KEDA's own cool-down only gates scaling to zero
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"stabilizationWindowSeconds": rule.scale_up_stabilization_s, "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": rule.scale_up_step,
                                      "periodSeconds": rule.polling_interval_s}]},
            "scaleDown": {"stabilizationWindowSeconds": rule.scale_down_stabilization_s, "selectPolicy": "Max",
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": rule.scale_down_cooldown_s}]},
        }}},
        "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
            "serverAddress": prometheus_url, "query": query, "threshold": f"{rule.waiting_per_replica:g}"}}],
    }


def rule_from_keda(scaled_spec: dict[str, Any]) -> AutoscaleRule:
    """The AutoscaleRule a ScaledObject's spec carries (the inverse of keda_scaled_object_spec)."""
    behavior = scaled_spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    return AutoscaleRule(
        min_replicas=scaled_spec["minReplicaCount"], max_replicas=scaled_spec["maxReplicaCount"],
        waiting_per_replica=float(scaled_spec["triggers"][0]["metadata"]["threshold"]),
        polling_interval_s=scaled_spec["pollingInterval"],
        scale_up_stabilization_s=behavior["scaleUp"]["stabilizationWindowSeconds"],
        scale_down_stabilization_s=behavior["scaleDown"]["stabilizationWindowSeconds"],
        scale_down_cooldown_s=behavior["scaleDown"]["policies"][0]["periodSeconds"],
        scale_up_step=behavior["scaleUp"]["policies"][0]["value"],
    )


def scaled_object(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    """KEDA: add engine replicas when requests queue up inside the engines (vlmserve.autoscale's rule)."""
    rule = autoscale_rule(spec, options)
    query = f'sum({rule.metric}{{namespace="{options.namespace}",service="{engine_name(spec)}"}})'
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": _meta(engine_name(spec), options, _labels(spec, "engine")),
        "spec": keda_scaled_object_spec(rule, query, options.prometheus_url, engine_name(spec)),
    }


def _monitoring_meta(name: str, spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "vlmserve", "app.kubernetes.io/instance": spec.name,
              **dict(options.monitoring_labels)}
    return _meta(name, options, labels)


def service_monitor(spec: DeploymentSpec, options: K8sOptions) -> dict[str, Any]:
    """Prometheus Operator scrapes the engine and gateway Services; job = their vlmserve.io/job label."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": _monitoring_meta(spec.name, spec, options),
        "spec": {
            "jobLabel": JOB_LABEL,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "vlmserve",
                                         "app.kubernetes.io/instance": spec.name}},
            "namespaceSelector": {"matchNames": [options.namespace]},
            # the label the dashboards and alerts split deployments by, as prometheus.yml sets it
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s", "relabelings": [{
                "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
                "targetLabel": DEPLOYMENT_LABEL}]}],
        },
    }


def prometheus_rule(spec: DeploymentSpec, options: K8sOptions, settings: AlertSettings) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": _monitoring_meta(spec.name, spec, options),
        "spec": alert_rules(settings),
    }


def render_manifests(spec: DeploymentSpec, options: K8sOptions, settings: AlertSettings) -> dict[str, dict]:
    """File name -> manifest, in the order `kubectl apply` should see them."""
    if options.discovery not in DISCOVERY_KINDS:
        raise UserError(f"--discovery {options.discovery!r}: choose {' or '.join(DISCOVERY_KINDS)}")
    manifests = {
        "engine-deployment.yaml": engine_deployment(spec, options),
        "engine-service.yaml": engine_service(spec, options),
    }
    if spec.gateway:
        if options.discovery == "k8s":
            manifests.update(gateway_rbac(spec, options))
        manifests["redis-deployment.yaml"] = redis_deployment(spec, options)
        manifests["redis-service.yaml"] = redis_service(spec, options)
        manifests["gateway-deployment.yaml"] = gateway_deployment(spec, options)
        manifests["gateway-service.yaml"] = gateway_service(spec, options)
    manifests["engine-scaledobject.yaml"] = scaled_object(spec, options)
    manifests["servicemonitor.yaml"] = service_monitor(spec, options)
    manifests["prometheusrule.yaml"] = prometheus_rule(spec, options, settings)
    return manifests
