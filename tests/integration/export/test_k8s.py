"""`vlmserve export k8s`: manifests validate against Kubernetes' schemas and the published CRD schemas, offline."""

from __future__ import annotations

import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helpers.crd_schemas import validate
from vlmserve.errors import UserError
from vlmserve.export.k8s import K8sOptions, render_manifests
from vlmserve.observe.alerts import AlertSettings
from vlmserve.spec import DeploymentSpec


def gpu_spec() -> DeploymentSpec:
    return DeploymentSpec.model_validate(
        {
            "name": "radiology",
            "model": "Qwen/Qwen2.5-VL-7B-Instruct",
            "replicas": 2,
            "port": 9000,
            "ready_timeout_s": 900,
            "env": {"VLLM_LOGGING_LEVEL": "INFO"},
            "engine_args": {
                "tensor_parallel_size": 2,
                "max_model_len": 8192,
                "enable_prefix_caching": True,
                "limit_mm_per_prompt": {"image": 2},
            },
        }
    )


def flag(args: list[str], name: str) -> str:
    """The value after `name` in a container's args."""
    return args[args.index(name) + 1]


def by_kind(manifests: dict[str, dict]) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests.values()}


def test_gpu_deployment_manifests_validate_and_carry_the_spec() -> None:
    manifests = render_manifests(gpu_spec(), K8sOptions(namespace="vision"), AlertSettings(ttft_slo_s=0.3))
    for manifest in manifests.values():
        validate(manifest)
    objects = by_kind(manifests)
    engine = objects[("Deployment", "radiology-engine")]
    assert engine["spec"]["replicas"] == 2
    pod = engine["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["command"] == ["vllm", "serve"]
    assert container["args"][container["args"].index("--model") + 1] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert container["args"][container["args"].index("--host") + 1] == "0.0.0.0"
    assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == "2"
    assert '{"image":2}' in container["args"]
    # startup budget covers the spec's model-load timeout: 900 s / 10 s period
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 900
    assert container["readinessProbe"] and container["livenessProbe"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert ("Service", "radiology-engine") in objects
    gateway = objects[("Deployment", "radiology-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert flag(gateway["args"], "--discover") == "dns:radiology-engine.vision.svc.cluster.local:8000"
    assert objects[("Service", "radiology-engine")]["spec"]["clusterIP"] == "None"  # headless: one record per pod
    assert objects[("Service", "radiology-gateway")]["spec"]["ports"][0]["port"] == 9000
    scaled = objects[("ScaledObject", "radiology-engine")]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "radiology-engine"
    assert scaled["minReplicaCount"] == 2
    assert "vllm:num_requests_waiting" in scaled["triggers"][0]["metadata"]["query"]
    rule = objects[("PrometheusRule", "radiology")]["spec"]["groups"][0]["rules"]
    ttft = next(r for r in rule if r["alert"] == "VlmserveTTFTAboveSLO")
    assert ttft["expr"].endswith("> 0.3")


def test_sim_engine_spec_needs_no_gpu() -> None:
    spec = DeploymentSpec.model_validate(
        {"name": "demo", "engine": "sim", "replicas": 1, "sim": {"profile": "fast"}, "gateway": False}
    )
    manifests = render_manifests(spec, K8sOptions(), AlertSettings())
    for manifest in manifests.values():
        validate(manifest)
    container = manifests["engine-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["engine", "sim"] and "nvidia.com/gpu" not in str(container["resources"])
    assert "gateway-deployment.yaml" not in manifests and "redis-deployment.yaml" not in manifests


def test_a_wrong_field_is_caught_by_the_schemas() -> None:
    """The validation is real: a misspelt field or a non-string KEDA threshold fails."""
    manifests = render_manifests(gpu_spec(), K8sOptions(), AlertSettings())
    deployment = manifests["engine-deployment.yaml"]
    deployment["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    scaled = manifests["engine-scaledobject.yaml"]
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 5
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


def test_local_weights_need_a_volume_claim(tmp_path: Path) -> None:
    weights = tmp_path / "qwen-vl"
    weights.mkdir()
    spec = DeploymentSpec(model=str(weights))
    with pytest.raises(UserError, match="--model-pvc"):
        render_manifests(spec, K8sOptions(), AlertSettings())
    manifests = render_manifests(spec, K8sOptions(model_pvc="weights"), AlertSettings())
    container = manifests["engine-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--model") + 1] == "/models/qwen-vl"
    validate(manifests["engine-deployment.yaml"])


def run_cli(vlmserve_cmd: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*vlmserve_cmd, "export", "k8s", *args], capture_output=True, text=True, timeout=60)


def test_cli_writes_valid_manifests(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(yaml.safe_dump(gpu_spec().model_dump(mode="json")))
    out = tmp_path / "k8s"
    done = run_cli(vlmserve_cmd, "-f", str(spec_file), "--out", str(out), "--monitoring-label", "release=kube-prometheus-stack")
    assert done.returncode == 0, done.stderr
    names = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    assert len(names) == 11  # engine, gateway and Redis Deployments and Services, 2 NetworkPolicies, 3 CRs
    for name in names:
        text = (out / name).read_text()
        assert "&id" not in text  # plain YAML, no anchors
        validate(yaml.safe_load(text))
    monitor = yaml.safe_load((out / "servicemonitor.yaml").read_text())
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize(
    "spec_text, extra, message",
    [
        ("model: embedded\n", [], "model 'embedded' is the tiny test model"),
        ("replicas: 0\n", [], "field 'replicas'"),
        ("model: org/m\n", ["--monitoring-label", "release"], "--monitoring-label: 'release' has no '='"),
        ("model: org/m\nreplicas: 3\n", ["--max-replicas", "2"], "--max-replicas 2 is below replicas: 3"),
        ("model: org/m\n", ["--discovery", "consul"], "--discovery 'consul': choose dns or k8s"),
    ],
)
def test_cli_bad_input_is_one_line(
    tmp_path: Path, vlmserve_cmd: list[str], spec_text: str, extra: list[str], message: str
) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(spec_text)
    done = run_cli(vlmserve_cmd, "-f", str(spec_file), "--out", str(tmp_path / "out"), *extra)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_missing_spec_file(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    done = run_cli(vlmserve_cmd, "-f", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "no such file" in done.stderr


def test_two_gateways_discover_the_engine_pods_and_share_redis() -> None:
    """The gateways see every engine pod (a headless Service's DNS records), not one Service
    address, so they balance, eject and drain pods one by one and see the ones KEDA adds; two of
    them share admission state through Redis, failing open if it is unreachable. (The manifests are checked here, not run.)"""
    manifests = render_manifests(gpu_spec(), K8sOptions(namespace="vision"), AlertSettings())
    for manifest in manifests.values():
        validate(manifest)
    objects = by_kind(manifests)
    gateway = objects[("Deployment", "radiology-gateway")]
    assert gateway["spec"]["replicas"] == 2
    pod = gateway["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--replica" not in args
    assert flag(args, "--discover") == "dns:radiology-engine.vision.svc.cluster.local:8000"
    state = next(e["value"] for e in pod["containers"][0]["env"] if e["name"] == "VLMSERVE_GATEWAY_STATE")
    assert state == "redis://:$(REDIS_PASSWORD)@radiology-redis.vision.svc:6379/0"  # password from the Secret
    assert flag(args, "--state-unavailable") == "open"
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"  # routable engines: ready
    assert container["livenessProbe"]["httpGet"]["path"] == "/metrics"  # engines loading never restart it
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    redis = objects[("Deployment", "radiology-redis")]["spec"]["template"]["spec"]["containers"][0]
    assert redis["ports"][0]["containerPort"] == 6379
    redis_service = objects[("Service", "radiology-redis")]["spec"]
    assert redis_service["ports"][0]["port"] == 6379
    assert redis_service["selector"] == objects[("Deployment", "radiology-redis")]["spec"]["selector"]["matchLabels"]
    assert "serviceAccountName" not in pod and ("Role", "radiology-gateway") not in objects  # DNS needs no API access
    # the discover value is one the gateway accepts
    from vlmserve.discovery.sources import DnsSource, parse_source

    source = parse_source(flag(args, "--discover"))
    assert isinstance(source, DnsSource) and source.port == 8000


def test_endpointslice_discovery_gets_a_least_privilege_role() -> None:
    manifests = render_manifests(gpu_spec(), K8sOptions(namespace="vision", discovery="k8s"), AlertSettings())
    for manifest in manifests.values():
        validate(manifest)
    objects = by_kind(manifests)
    pod = objects[("Deployment", "radiology-gateway")]["spec"]["template"]["spec"]
    assert flag(pod["containers"][0]["args"], "--discover") == "k8s:vision/radiology-engine:http"
    assert pod["serviceAccountName"] == "radiology-gateway"
    assert ("ServiceAccount", "radiology-gateway") in objects
    role = objects[("Role", "radiology-gateway")]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    binding = objects[("RoleBinding", "radiology-gateway")]
    assert binding["roleRef"]["name"] == "radiology-gateway"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "radiology-gateway", "namespace": "vision"}]
    names = list(manifests)  # the RBAC objects are applied before the gateway that uses them
    assert names.index("gateway-rolebinding.yaml") < names.index("gateway-deployment.yaml")
    # the engine Service's port is named as the source says
    assert objects[("Service", "radiology-engine")]["spec"]["ports"][0]["name"] == "http"
