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

The trust boundary travels too (export/k8s_security.py): the spec's keys, TLS and audit log reach
the gateways as Secret and audit volumes with the flags `up` passes, Redis asks for a password,
and NetworkPolicies let only the gateways reach the engines and Redis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from vlmserve import __version__
from vlmserve.autoscale import AutoscaleRule
from vlmserve.engines.launcher import make_launcher
from vlmserve.errors import UserError
from vlmserve.export.k8s_security import (
    MONITORING_NAMESPACE,
    REDIS_CLI_AUTH_ENV,
    REDIS_PASSWORD_ENV,
    check_dns_label,
    check_trust_settings,
    embedded_secrets,
    engine_network_policy,
    gateway_security,
    redis_network_policy,
    redis_password_env,
    secret_commands,
    trust_warnings,
)
from vlmserve.gateway.config import media_policy_argv
from vlmserve.gateway.shared_state import STATE_ENV, STATE_UNAVAILABLE_FLAG
from vlmserve.json_types import JSONObject, JSONValue
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
VLLM_SERVE = ["vllm", "serve"]  # vLLM's documented server command; `python -m ...api_server` is deprecated
GATEWAY_IMAGE = f"vlmserve:{__version__}".replace("+", "-")  # what the repository's Dockerfile builds
ENGINE_CPUS_PER_GPU = 4
ENGINE_GIB_PER_GPU = 16
GPU_RESOURCE = "nvidia.com/gpu"
GATEWAY_UID = 10001  # the Dockerfile's USER; also the group owning the audit volume and the Secret files


@dataclass(frozen=True)
class K8sOptions:
    """What a cluster needs that a one-machine DeploymentSpec does not say."""

    namespace: str = "default"
    vllm_image: str = "vllm/vllm-openai:latest"
    vlmserve_image: str = GATEWAY_IMAGE
    model_pvc: str | None = None
    hf_token_secret: str | None = None
    max_replicas: int | None = None
    waiting_per_replica: float | None = None  # None: the spec's autoscale rule (or its default)
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    monitoring_labels: tuple[tuple[str, str], ...] = ()
    shm_size: str = "8Gi"
    discovery: str = "dns"  # how the gateway finds the engine pods: dns (headless Service) or k8s (EndpointSlices)
    redis_image: str = "redis:7-alpine"
    embed_secrets: bool = False  # write key material into Secret manifests instead of printing kubectl commands
    audit_pvc: str | None = None  # claim for the gateways' audit logs; None: an emptyDir (lost on restart)
    monitoring_namespace: str | None = MONITORING_NAMESPACE  # may reach the engines' port, for /metrics


def _labels(spec: DeploymentSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vlmserve",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
    }


def _meta(name: str, options: K8sOptions, labels: Mapping[str, str]) -> JSONObject:
    return {"name": name, "namespace": options.namespace, "labels": {**labels}}


def engine_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-engine"


def gateway_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-gateway"


def redis_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-redis"


def _is_local_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def _model_location(spec: DeploymentSpec, options: K8sOptions) -> tuple[str, list[JSONValue], list[JSONValue]]:
    """(model argument inside the pod, volumes, volume mounts) for the engine container."""
    if spec.engine == "sim":
        return spec.model, [], []
    if spec.model == EMBEDDED_MODEL:
        raise UserError(
            "model 'embedded' is the tiny test model that exists only on this machine; "
            "set model: to a Hugging Face id or a weights folder (with --model-pvc)"
        )
    if _is_local_path(spec.model):
        if not options.model_pvc:
            raise UserError(
                f"model '{spec.model}' is a local folder; copy it to a PersistentVolumeClaim "
                "and pass --model-pvc NAME (it is mounted at /models/<folder name>)"
            )
        in_pod = str(PurePosixPath(MODEL_MOUNT) / Path(spec.model).expanduser().name)
        return (
            in_pod,
            [{"name": "models", "persistentVolumeClaim": {"claimName": options.model_pvc, "readOnly": True}}],
            [{"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True}],
        )
    return (spec.model, [{"name": "hf-cache", "emptyDir": {}}], [{"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}])


def startup_budget(ready_timeout_s: float) -> dict[str, int]:
    """A startup probe's period and failure count covering the spec's model-load time (ready_timeout_s)."""
    return {
        "periodSeconds": STARTUP_PROBE_PERIOD_S,
        "failureThreshold": max(1, math.ceil(ready_timeout_s / STARTUP_PROBE_PERIOD_S)),
    }


def _probes(ready_timeout_s: float) -> JSONObject:
    """Startup budget covers model load (the spec's ready timeout); after that, quick checks."""
    health: JSONObject = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "startupProbe": {**health, "timeoutSeconds": 5, **startup_budget(ready_timeout_s)},
        "readinessProbe": {**health, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def gateway_port_name(spec: DeploymentSpec) -> str:
    """`https` when the spec gives the gateway TLS (the ServiceMonitor scrapes it so), else `http`."""
    return "https" if spec.ssl_certfile else "http"


def _gateway_probes(port: str = "http", scheme: str = "HTTP") -> JSONObject:
    """Ready while some engine pod is routable (/health); alive while the process answers (/metrics).

    Liveness must not follow the engines: while they load a model for minutes, or all restart, a
    gateway restarted for it would only lose its state and connections."""
    get = {"port": port, "scheme": scheme}
    return {
        "readinessProbe": {"httpGet": {"path": "/health", **get}, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", **get},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
    }


def _env(spec: DeploymentSpec, options: K8sOptions) -> list[JSONValue]:
    env: list[JSONValue] = [{"name": key, "value": value} for key, value in sorted(spec.env.items())]
    if options.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": options.hf_token_secret, "key": "token"}}})
    return env


def engine_container_command(spec: DeploymentSpec, model: str, notes: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(command, args) of the engine container: the flags `vlmserve up` passes, from the same
    EngineLauncher, listening on the pod's network; the image's program replaces this machine's
    (`vllm serve`, which takes `--model` as well as the positional model). `notes` collects what
    the recipe did, and a warning naming what it skipped when this machine cannot read config.json."""
    launcher = make_launcher(
        spec,
        model_path=model,
        device_kind="cpu" if spec.devices == "cpu" else "gpu",
        on_event=None if notes is None else lambda line: notes.append(_recipe_note(line)),
    )
    args = launcher.arguments(host="0.0.0.0", port=CONTAINER_PORT, index=0)
    command = ["vlmserve"] if spec.engine == "sim" else list(VLLM_SERVE)
    return command, args


def _recipe_note(line: str) -> str:
    """A skipped recipe is a warning: the pods would run on vLLM's defaults where `up` would not."""
    skipped = "recipe: none "
    return f"warning: no recipe in the engine's flags {line.removeprefix(skipped)}" if line.startswith(skipped) else line


def engine_requests(spec: DeploymentSpec) -> dict[str, str]:
    """One engine pod's resource requests: GPUs = tensor-parallel size, 4 CPUs and 16 GiB per GPU."""
    if spec.engine == "sim":
        return {"cpu": "500m", "memory": "512Mi"}
    tp = spec.engine_args.tensor_parallel_size
    gpus = {} if spec.devices == "cpu" else {GPU_RESOURCE: str(tp)}
    return {**gpus, "cpu": str(ENGINE_CPUS_PER_GPU * tp), "memory": f"{ENGINE_GIB_PER_GPU * tp}Gi"}


def engine_resources(spec: DeploymentSpec) -> JSONObject:
    """One engine pod's requests, and its GPUs again as limits (Kubernetes needs both for extended resources)."""
    requests = engine_requests(spec)
    resources: JSONObject = {"requests": {**requests}}
    if GPU_RESOURCE in requests:
        resources["limits"] = {GPU_RESOURCE: requests[GPU_RESOURCE]}
    return resources


def _engine_container(
    spec: DeploymentSpec, options: K8sOptions, model: str, mounts: list[JSONValue], notes: list[str] | None = None
) -> JSONObject:
    command, args = engine_container_command(spec, model, notes)
    image = options.vlmserve_image if spec.engine == "sim" else options.vllm_image
    return {
        "name": "engine",
        "image": image,
        "command": [*command],
        "args": [*args],
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "env": _env(spec, options),
        "resources": engine_resources(spec),
        **_probes(spec.ready_timeout_s),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *mounts],  # noqa: S108 - the pod's shared memory
    }


def engine_deployment(spec: DeploymentSpec, options: K8sOptions, notes: list[str] | None = None) -> JSONObject:
    """The replica group as one Deployment (replicas = spec.replicas)."""
    model, volumes, mounts = _model_location(spec, options)
    labels = _labels(spec, "engine")
    pod_spec: JSONObject = {
        "terminationGracePeriodSeconds": 60,
        "containers": [_engine_container(spec, options, model, mounts, notes)],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}}, *volumes],
    }
    if spec.engine == "vllm" and spec.devices != "cpu":
        pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(engine_name(spec), options, labels),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": {**labels}},
            "template": {"metadata": {"labels": {**labels}}, "spec": pod_spec},
        },
    }


def _service(
    name: str,
    spec: DeploymentSpec,
    options: K8sOptions,
    component: str,
    job: str,
    port: int,
    headless: bool = False,
    port_name: str = "http",
) -> JSONObject:
    selector = _labels(spec, component)
    service_spec: JSONObject = {
        "selector": {**selector},
        "ports": [{"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}],
    }
    if headless:
        service_spec["clusterIP"] = "None"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, options, {**selector, JOB_LABEL: job}),
        "spec": service_spec,
    }


def engine_service(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    """Headless: its DNS name resolves to every ready engine pod (and its EndpointSlices list them),
    which is how the gateway finds them; Prometheus scrapes the same endpoints."""
    return _service(engine_name(spec), spec, options, "engine", ENGINE_JOB, CONTAINER_PORT, headless=True)


def discover_source(spec: DeploymentSpec, options: K8sOptions) -> str:
    """The gateway's --discover value for the engine pods."""
    if options.discovery == "k8s":
        return f"k8s:{options.namespace}/{engine_name(spec)}:http"
    return f"dns:{engine_name(spec)}.{options.namespace}.svc.cluster.local:{CONTAINER_PORT}"


def redis_url(spec: DeploymentSpec, options: K8sOptions) -> str:
    """The gateways' --state URL, in their environment (STATE_ENV): Kubernetes expands the password
    from the Redis Secret into it, so it is in no manifest and in no process's argv."""
    return f"redis://:$({REDIS_PASSWORD_ENV})@{redis_name(spec)}.{options.namespace}.svc:{REDIS_PORT}/0"


def gateway_deployment(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    """Two gateways on different nodes where possible, each discovering the engine pods and sharing
    admission through Redis (failing open if Redis is unreachable)."""
    labels = _labels(spec, "gateway")
    security = gateway_security(spec, options)
    port_name = gateway_port_name(spec)
    container: JSONObject = {
        "name": "gateway",
        "image": options.vlmserve_image,
        "command": ["vlmserve"],
        "args": [
            "gateway",
            "--host",
            "0.0.0.0",
            "--port",
            str(CONTAINER_PORT),
            "--discover",
            discover_source(spec, options),
            "--policy",
            spec.gateway_policy,
            STATE_UNAVAILABLE_FLAG,
            STATE_UNAVAILABLE,
            *security.args,
            *media_policy_argv(spec),
        ],
        # the password first: Kubernetes expands $(REDIS_PASSWORD) only from variables defined before
        "env": [*security.env, {"name": STATE_ENV, "value": redis_url(spec, options)}],
        "ports": [{"name": port_name, "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        **_gateway_probes(port_name, "HTTPS" if security.tls else "HTTP"),
    }
    if security.mounts:
        container["volumeMounts"] = security.mounts
    pod_spec: JSONObject = {
        "containers": [container],
        # fsGroup: the audit volume is writable, and the Secret files readable, by the image's user
        "securityContext": {"runAsNonRoot": True, "runAsUser": GATEWAY_UID, "runAsGroup": GATEWAY_UID, "fsGroup": GATEWAY_UID},
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {**labels}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
    }
    if security.volumes:
        pod_spec["volumes"] = security.volumes
    if options.discovery == "k8s":
        pod_spec["serviceAccountName"] = gateway_name(spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(gateway_name(spec), options, labels),
        "spec": {
            "replicas": GATEWAY_REPLICAS,
            "selector": {"matchLabels": {**labels}},
            "template": {"metadata": {"labels": {**labels}}, "spec": pod_spec},
        },
    }


def gateway_rbac(spec: DeploymentSpec, options: K8sOptions) -> dict[str, JSONObject]:
    """`--discovery k8s`: the gateway's ServiceAccount may list and watch EndpointSlices in its namespace, nothing else."""
    labels = _labels(spec, "gateway")
    name = gateway_name(spec)
    return {
        "gateway-serviceaccount.yaml": {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, options, labels)},
        "gateway-role.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(name, options, labels),
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}],
        },
        "gateway-rolebinding.yaml": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(name, options, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": options.namespace}],
        },
    }


def redis_deployment(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    """The gateways' shared admission state: rate-limit buckets that may be lost on restart (no persistence)."""
    labels = _labels(spec, "redis")
    ping: JSONObject = {"exec": {"command": ["redis-cli", "ping"]}}  # authenticated through REDISCLI_AUTH
    container: JSONObject = {
        "name": "redis",
        "image": options.redis_image,
        # the password is expanded from the Secret by Kubernetes; it is visible only inside this container
        "command": ["redis-server"],
        "args": ["--requirepass", f"$({REDIS_PASSWORD_ENV})", "--save", "", "--appendonly", "no"],
        "env": [redis_password_env(spec), redis_password_env(spec, REDIS_CLI_AUTH_ENV)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "readinessProbe": {**ping, "periodSeconds": 5, "timeoutSeconds": 2},
        "livenessProbe": {**ping, "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 6},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(redis_name(spec), options, labels),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {**labels}},
            "template": {"metadata": {"labels": {**labels}}, "spec": {"containers": [container]}},
        },
    }


def redis_service(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    labels = _labels(spec, "redis")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(redis_name(spec), options, labels),
        "spec": {
            "selector": {**labels},
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}],
        },
    }


def gateway_service(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    return _service(gateway_name(spec), spec, options, "gateway", GATEWAY_JOB, spec.port, port_name=gateway_port_name(spec))


def autoscale_rule(spec: DeploymentSpec, options: K8sOptions) -> AutoscaleRule:
    """The rule KEDA runs: the spec's `autoscale:` (the one `up --autoscale` runs), else the
    spec's replica count as the floor; `--max-replicas` and `--waiting-per-replica` override."""
    rule = spec.autoscale or AutoscaleRule(min_replicas=spec.replicas, max_replicas=max(spec.replicas * 4, spec.replicas + 1))
    updates: dict[str, float] = {}
    if options.max_replicas is not None:
        updates["max_replicas"] = options.max_replicas
    if options.waiting_per_replica is not None:
        updates["waiting_per_replica"] = options.waiting_per_replica
    if updates.get("max_replicas", rule.max_replicas) < rule.min_replicas:
        where = "autoscale.min_replicas" if spec.autoscale else "replicas"
        raise UserError(f"--max-replicas {options.max_replicas} is below {where}: {rule.min_replicas} in the spec; raise it")
    return AutoscaleRule.model_validate({**rule.model_dump(), **updates}) if updates else rule


def hpa_behavior(rule: AutoscaleRule) -> JSONObject:
    """The HorizontalPodAutoscaler behaviour carrying the rule's stabilization windows, step and cool-down."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": rule.scale_up_stabilization_s,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": rule.scale_up_step, "periodSeconds": rule.polling_interval_s}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": rule.scale_down_stabilization_s,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": rule.scale_down_cooldown_s}],
        },
    }


def keda_scaled_object_spec(rule: AutoscaleRule, query: str, prometheus_url: str, target: str) -> JSONObject:
    """A ScaledObject's spec carrying `rule` field for field (rule_from_keda reads it back)."""
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "minReplicaCount": rule.min_replicas,
        "maxReplicaCount": rule.max_replicas,
        "pollingInterval": rule.polling_interval_s,
        "cooldownPeriod": rule.scale_down_cooldown_s,  # KEDA's own cool-down only gates scaling to zero
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": hpa_behavior(rule)}},
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {"serverAddress": prometheus_url, "query": query, "threshold": f"{rule.waiting_per_replica:g}"},
            }
        ],
    }


def _at(document: JSONValue, *path: str | int) -> JSONValue:
    """The value at `path` (keys of objects, indexes of lists) in a parsed manifest; a ValueError
    naming the path where the manifest does not have that shape."""
    found = document
    for step in path:
        if isinstance(step, str) and isinstance(found, dict) and step in found:
            found = found[step]
        elif isinstance(step, int) and isinstance(found, list) and 0 <= step < len(found):
            found = found[step]
        else:
            raise ValueError(f"the manifest has no {'.'.join(map(str, path))}")
    return found


def rule_from_keda(scaled_spec: JSONObject) -> AutoscaleRule:
    """The AutoscaleRule a ScaledObject's spec carries (the inverse of keda_scaled_object_spec)."""
    behavior = _at(scaled_spec, "advanced", "horizontalPodAutoscalerConfig", "behavior")
    threshold = _at(scaled_spec, "triggers", 0, "metadata", "threshold")
    return AutoscaleRule.model_validate(
        {
            "min_replicas": scaled_spec.get("minReplicaCount"),
            "max_replicas": scaled_spec.get("maxReplicaCount"),
            "waiting_per_replica": float(threshold) if isinstance(threshold, (str, int, float)) else threshold,
            "polling_interval_s": scaled_spec.get("pollingInterval"),
            "scale_up_stabilization_s": _at(behavior, "scaleUp", "stabilizationWindowSeconds"),
            "scale_down_stabilization_s": _at(behavior, "scaleDown", "stabilizationWindowSeconds"),
            "scale_down_cooldown_s": _at(behavior, "scaleDown", "policies", 0, "periodSeconds"),
            "scale_up_step": _at(behavior, "scaleUp", "policies", 0, "value"),
        }
    )


def scaled_object(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    """KEDA: add engine replicas when requests queue up inside the engines (vlmserve.autoscale's rule)."""
    rule = autoscale_rule(spec, options)
    query = f'sum({rule.metric}{{namespace="{options.namespace}",service="{engine_name(spec)}"}})'
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(engine_name(spec), options, _labels(spec, "engine")),
        "spec": keda_scaled_object_spec(rule, query, options.prometheus_url, engine_name(spec)),
    }


def _monitoring_meta(name: str, spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    labels = {"app.kubernetes.io/name": "vlmserve", "app.kubernetes.io/instance": spec.name, **dict(options.monitoring_labels)}
    return _meta(name, options, labels)


def service_monitor(spec: DeploymentSpec, options: K8sOptions) -> JSONObject:
    """Prometheus Operator scrapes the engine and gateway Services; job = their vlmserve.io/job label."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _monitoring_meta(spec.name, spec, options),
        "spec": {
            "jobLabel": JOB_LABEL,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "vlmserve", "app.kubernetes.io/instance": spec.name}},
            "namespaceSelector": {"matchNames": [options.namespace]},
            "endpoints": _scrape_endpoints(spec),
        },
    }


def _scrape_endpoints(spec: DeploymentSpec) -> list[JSONValue]:
    """One endpoint per port name: `http` (engines, a plain gateway) and, with TLS, the gateway's `https`.

    The TLS scrape encrypts but does not verify the gateway's certificate (its CA is the operator's);
    set tlsConfig.ca in the ServiceMonitor to verify it."""
    # the label the dashboards and alerts split deployments by, as prometheus.yml sets it
    relabel: list[JSONValue] = [
        {"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"], "targetLabel": DEPLOYMENT_LABEL}
    ]
    endpoints: list[JSONValue] = [{"port": "http", "path": "/metrics", "interval": "15s", "relabelings": relabel}]
    if gateway_port_name(spec) == "https":
        endpoints.append(
            {
                "port": "https",
                "scheme": "https",
                "path": "/metrics",
                "interval": "15s",
                "tlsConfig": {"insecureSkipVerify": True},
                "relabelings": relabel,
            }
        )
    return endpoints


def prometheus_rule(spec: DeploymentSpec, options: K8sOptions, settings: AlertSettings) -> JSONObject:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _monitoring_meta(spec.name, spec, options),
        "spec": alert_rules(settings),
    }


@dataclass
class K8sExport:
    """The manifests (file name -> object, in the order `kubectl apply` should see them), the
    `kubectl create secret` commands to run first (none with --embed-secrets), and what to warn about."""

    manifests: dict[str, JSONObject] = field(default_factory=dict)
    secret_commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)  # file name -> YAML comment written above it


def export_manifests(spec: DeploymentSpec, options: K8sOptions, settings: AlertSettings) -> K8sExport:
    """Everything `vlmserve export k8s` writes and says; every check runs before anything is built."""
    if options.discovery not in DISCOVERY_KINDS:
        raise UserError(f"--discovery {options.discovery!r}: choose {' or '.join(DISCOVERY_KINDS)}")
    check_options(options)
    check_trust_settings(spec)
    found = K8sExport(notes=trust_warnings(spec, options))
    if options.embed_secrets:
        found.manifests.update(embedded_secrets(spec, options))
    else:
        found.secret_commands = secret_commands(spec, options)
    found.manifests["engine-deployment.yaml"] = engine_deployment(spec, options, found.notes)
    found.manifests["engine-service.yaml"] = engine_service(spec, options)
    found.manifests.update(_cluster_objects(spec, options, settings))
    return found


def render_manifests(spec: DeploymentSpec, options: K8sOptions, settings: AlertSettings) -> dict[str, JSONObject]:
    """File name -> manifest, in the order `kubectl apply` should see them."""
    return export_manifests(spec, options, settings).manifests


def check_options(options: K8sOptions) -> None:
    """Names that land in manifests: one line for one that Kubernetes would refuse at apply time."""
    check_dns_label("--namespace", options.namespace)
    for flag, value in (
        ("--monitoring-namespace", options.monitoring_namespace),
        ("--audit-pvc", options.audit_pvc),
        ("--model-pvc", options.model_pvc),
        ("--hf-token-secret", options.hf_token_secret),
    ):
        if value:
            check_dns_label(flag, value)


def network_policies(spec: DeploymentSpec, options: K8sOptions) -> dict[str, JSONObject]:
    """Engines and Redis take connections from the gateway pods only (engines also from the
    monitoring namespace, for /metrics). With `gateway: false` the engines are the door: no policy."""
    if not spec.gateway:
        return {}
    gateway_pods = _labels(spec, "gateway")
    return {
        "engine-networkpolicy.yaml": engine_network_policy(spec, options, _labels(spec, "engine"), gateway_pods, CONTAINER_PORT),
        "redis-networkpolicy.yaml": redis_network_policy(spec, options, _labels(spec, "redis"), gateway_pods, REDIS_PORT),
    }


def _cluster_objects(spec: DeploymentSpec, options: K8sOptions, settings: AlertSettings) -> dict[str, JSONObject]:
    """Every object after the engine's Deployment and Service."""
    manifests: dict[str, JSONObject] = network_policies(spec, options)
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
