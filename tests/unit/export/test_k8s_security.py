"""`vlmserve export k8s` carries the trust boundary: the spec's keys, TLS and audit log reach the gateways
(as Secret and audit volumes, with the flags `vlmserve gateway` itself parses), Redis asks for a password,
only the gateways reach the engines and Redis, and nothing is exported with a file missing."""

from __future__ import annotations

import base64
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from tests.helpers.cli import run_cli
from tests.helpers.crd_schemas import validate
from tests.helpers.tls import self_signed_certificate
from vlmserve.cli.app import build_app
from vlmserve.errors import UserError
from vlmserve.export.k8s import K8sOptions, export_manifests, render_manifests
from vlmserve.export.k8s_security import REDIS_PASSWORD_ENV
from vlmserve.gateway.config import GATEWAY_FILE_FLAGS
from vlmserve.gateway.shared_state import STATE_ENV, parse_state_url
from vlmserve.observe.alerts import AlertSettings
from vlmserve.spec import DeploymentSpec

KEYS_TEXT = "tenants:\n  - name: radiology\n    keys: [sk-radiology-secret-1]\n    requests_per_s: 5\n"


def secured_spec(tmp_path: Path, **extra: Any) -> DeploymentSpec:
    """A sim-engine spec with a real keys file, a real certificate and key, and an audit log."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_TEXT)
    cert, key = self_signed_certificate(tmp_path)
    return DeploymentSpec.model_validate(
        {
            "name": "radiology",
            "engine": "sim",
            "model": "sim-vlm",
            "replicas": 2,
            "port": 9443,
            "keys_file": str(keys),
            "ssl_certfile": str(cert),
            "ssl_keyfile": str(key),
            "audit_log": str(tmp_path / "audit.jsonl"),
            **extra,
        }
    )


def objects(manifests: dict[str, dict]) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests.values()}


def pod(manifest: dict) -> dict:
    return manifest["spec"]["template"]["spec"]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in a container's args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda match: env.get(match.group(1), match.group(0)), value)


def gateway_params(args: list[str]) -> dict[str, Any]:
    """What `vlmserve gateway` itself makes of the container's args (parsed by its real CLI, not run)."""
    command = typer.main.get_command(build_app()).commands["gateway"]  # type: ignore[attr-defined]
    return command.make_context("gateway", list(args[1:])).params


def mounted_file(gateway_pod: dict, path: str) -> tuple[dict, str]:
    """(the volume behind `path` in the gateway container, the key/file name under its mount)."""
    container = gateway_pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in gateway_pod["volumes"] if v["name"] == mount["name"])
    return volume, path.removeprefix(mount["mountPath"] + "/")


def test_keys_tls_and_audit_reach_the_gateway_as_mounted_files_with_its_own_flags(tmp_path: Path) -> None:
    spec = secured_spec(tmp_path)
    export = export_manifests(spec, K8sOptions(namespace="vision", audit_pvc="audit-logs"), AlertSettings())
    for manifest in export.manifests.values():
        validate(manifest)
    found = objects(export.manifests)
    gateway_pod = pod(found[("Deployment", "radiology-gateway")])
    container = gateway_pod["containers"][0]
    params = gateway_params(container["args"])
    # each file flag the gateway parses points into a read-only Secret volume, at the key it is stored under
    volume, key = mounted_file(gateway_pod, str(params["keys_file"]))
    assert volume["secret"]["secretName"] == "radiology-gateway-keys" and key == "keys.yaml"
    volume, key = mounted_file(gateway_pod, str(params["ssl_certfile"]))
    assert volume["secret"]["secretName"] == "radiology-gateway-tls" and key == "tls.crt"
    volume, key = mounted_file(gateway_pod, str(params["ssl_keyfile"]))
    assert volume["secret"]["secretName"] == "radiology-gateway-tls" and key == "tls.key"
    assert all(m["readOnly"] for m in container["volumeMounts"] if m["name"] != "audit")
    # the audit log: on the claim, one file per pod (Kubernetes expands the pod's name)
    volume, name = mounted_file(gateway_pod, str(params["audit_log"]))
    assert volume["persistentVolumeClaim"]["claimName"] == "audit-logs"
    assert expand(name, {"POD_NAME": "radiology-gateway-7d9-x2"}) == "audit-radiology-gateway-7d9-x2.jsonl"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert gateway_pod["securityContext"]["fsGroup"] == gateway_pod["securityContext"]["runAsUser"]
    # the flags are the ones `up` passes, written once
    for name, flag in GATEWAY_FILE_FLAGS.items():
        assert flag in container["args"], name
    # TLS: probes and Service speak HTTPS, and Prometheus scrapes it so
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["ports"][0]["name"] == "https"
    service_port = found[("Service", "radiology-gateway")]["spec"]["ports"][0]
    assert service_port == {"name": "https", "port": 9443, "targetPort": "https", "protocol": "TCP"}
    endpoints = found[("ServiceMonitor", "radiology")]["spec"]["endpoints"]
    assert {"port": "https", "scheme": "https"}.items() <= endpoints[1].items()
    assert not [m for m in export.manifests.values() if m["kind"] == "Secret"]  # see the next test


def test_key_material_stays_out_of_the_manifests_by_default(tmp_path: Path) -> None:
    spec = secured_spec(tmp_path)
    export = export_manifests(spec, K8sOptions(namespace="vision"), AlertSettings())
    text = yaml.safe_dump(export.manifests)
    assert "sk-radiology-secret-1" not in text and "PRIVATE KEY" not in text
    commands = export.secret_commands
    assert commands[0].startswith("kubectl create secret generic radiology-redis --namespace vision ")
    assert '--from-literal=password="$(openssl rand -hex 24)"' in commands[0]
    assert commands[1] == (
        f"kubectl create secret generic radiology-gateway-keys --namespace vision "
        f"--from-file=keys.yaml={tmp_path.resolve() / 'keys.yaml'}"
    )
    assert commands[2] == (
        f"kubectl create secret tls radiology-gateway-tls --namespace vision "
        f"--cert={tmp_path.resolve() / 'gw.crt'} --key={tmp_path.resolve() / 'gw.key'}"
    )
    # the audit log without a claim: an emptyDir, and a warning that says it does not survive
    gateway_pod = pod(objects(export.manifests)[("Deployment", "radiology-gateway")])
    assert {"name": "audit", "emptyDir": {}} in gateway_pod["volumes"]
    assert any(note.startswith("warning: audit_log goes to an emptyDir") and "--audit-pvc" in note for note in export.notes)


def test_embed_secrets_writes_the_files_content_and_a_fresh_redis_password(tmp_path: Path) -> None:
    spec = secured_spec(tmp_path)
    export = export_manifests(spec, K8sOptions(namespace="vision", embed_secrets=True), AlertSettings())
    assert export.secret_commands == []
    for manifest in export.manifests.values():
        validate(manifest)
    found = objects(export.manifests)
    assert found[("Secret", "radiology-gateway-keys")]["stringData"]["keys.yaml"] == KEYS_TEXT
    tls = found[("Secret", "radiology-gateway-tls")]
    assert tls["type"] == "kubernetes.io/tls"
    assert base64.b64decode(tls["data"]["tls.key"]) == (tmp_path / "gw.key").read_bytes()
    password = found[("Secret", "radiology-redis")]["stringData"]["password"]
    assert re.fullmatch(r"[0-9a-f]{48}", password)
    names = list(export.manifests)  # Secrets first: the pods that mount them come after
    assert max(names.index(n) for n in names if n.endswith("-secret.yaml")) < names.index("gateway-deployment.yaml")


def test_redis_asks_for_the_password_the_gateways_state_url_carries() -> None:
    spec = DeploymentSpec.model_validate({"name": "radiology", "engine": "sim", "model": "m"})
    found = objects(render_manifests(spec, K8sOptions(namespace="vision"), AlertSettings()))
    redis = pod(found[("Deployment", "radiology-redis")])["containers"][0]
    password = "0f" * 24  # what the Secret holds
    env = {"REDIS_PASSWORD": password}
    assert expand(" ".join(redis["args"]), env).startswith(f"--requirepass {password} ")
    secret_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    assert secret_refs["REDIS_PASSWORD"] == secret_refs["REDISCLI_AUTH"] == {"name": "radiology-redis", "key": "password"}
    gateway = pod(found[("Deployment", "radiology-gateway")])["containers"][0]
    names = [e["name"] for e in gateway["env"]]
    assert names.index(REDIS_PASSWORD_ENV) < names.index(STATE_ENV)  # defined before it is expanded
    state = next(e["value"] for e in gateway["env"] if e["name"] == STATE_ENV)
    assert password not in yaml.safe_dump(found) and "--state" not in gateway["args"]
    url = parse_state_url(expand(state, env))  # the gateway's own parser accepts the expanded URL
    assert url.url == f"redis://:{password}@radiology-redis.vision.svc:6379/0"
    assert password not in url.redacted


def _admits(policy: dict, pod_labels: dict[str, str], namespace: str, port: int) -> bool:
    """Does this NetworkPolicy let a pod (labels, namespace) connect to `port`? (the subset vlmserve writes)"""
    for rule in policy["spec"]["ingress"]:
        if port not in [p["port"] for p in rule["ports"]]:
            continue
        for peer in rule["from"]:
            if (
                "podSelector" in peer
                and namespace == policy["metadata"]["namespace"]
                and peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
            ):
                return True
            if "namespaceSelector" in peer and peer["namespaceSelector"]["matchLabels"] == {
                "kubernetes.io/metadata.name": namespace
            }:
                return True
    return False


def test_only_the_gateways_reach_the_engines_and_redis() -> None:
    """No Service exposes an engine's (or Redis's) port to other pods: each pod behind a Service is
    selected by a policy admitting the gateway pods alone (and Prometheus's namespace for the engines)."""
    spec = DeploymentSpec.model_validate({"name": "radiology", "model": "org/vlm", "port": 9000})
    manifests = render_manifests(spec, K8sOptions(namespace="vision", monitoring_namespace="observability"), AlertSettings())
    for manifest in manifests.values():
        validate(manifest)
    found = objects(manifests)
    gateway_pods = found[("Deployment", "radiology-gateway")]["spec"]["template"]["metadata"]["labels"]
    client_pod = {"app": "curl"}
    policies = [m for m in manifests.values() if m["kind"] == "NetworkPolicy"]
    for service in (m for m in manifests.values() if m["kind"] == "Service"):
        backends = next(
            m
            for m in manifests.values()
            if m["kind"] == "Deployment"
            and service["spec"]["selector"].items() <= m["spec"]["template"]["metadata"]["labels"].items()
        )
        pod_labels = backends["spec"]["template"]["metadata"]["labels"]
        if backends["metadata"]["name"] == "radiology-gateway":
            assert not [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()]
            continue  # the front door: clients come here
        guarding = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()]
        assert len(guarding) == 1 and guarding[0]["spec"]["policyTypes"] == ["Ingress"]
        policy = guarding[0]
        port = backends["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        assert _admits(policy, gateway_pods, "vision", port)
        assert not _admits(policy, client_pod, "vision", port)  # a pod beside them
        assert not _admits(policy, gateway_pods, "other-team", port)  # a look-alike in another namespace
        is_engine = backends["metadata"]["name"] == "radiology-engine"
        assert _admits(policy, {"app": "prometheus"}, "observability", port) is is_engine


def test_monitoring_exception_can_be_turned_off() -> None:
    spec = DeploymentSpec.model_validate({"name": "radiology", "model": "org/vlm"})
    manifests = render_manifests(spec, K8sOptions(monitoring_namespace=None), AlertSettings())
    policy = manifests["engine-networkpolicy.yaml"]
    assert len(policy["spec"]["ingress"]) == 1 and "podSelector" in policy["spec"]["ingress"][0]["from"][0]


def test_engines_run_vllm_serve() -> None:
    spec = DeploymentSpec.model_validate({"name": "radiology", "model": "org/vlm"})
    container = pod(render_manifests(spec, K8sOptions(), AlertSettings())["engine-deployment.yaml"])["containers"][0]
    assert container["command"] == ["vllm", "serve"]
    assert container["args"][container["args"].index("--model") + 1] == "org/vlm"


def test_a_recipe_that_cannot_be_read_here_is_a_warning_naming_it(tmp_path: Path) -> None:
    weights = tmp_path / "qwen-vl"
    weights.mkdir()  # no config.json: the recipe cannot be chosen on this machine
    export = export_manifests(DeploymentSpec(model=str(weights)), K8sOptions(model_pvc="weights"), AlertSettings())
    warnings = [note for note in export.notes if "recipe" in note]
    assert len(warnings) == 1 and len(warnings[0].splitlines()) == 1
    assert warnings[0].startswith("warning: no recipe in the engine's flags ")
    assert str(weights) in warnings[0] and "config.json" in warnings[0]


@pytest.mark.hostile("export k8s: a keys, certificate or key file the spec names does not exist")
@pytest.mark.parametrize("missing", ["keys_file", "ssl_certfile", "ssl_keyfile"])
def test_a_missing_file_refuses_the_export_naming_it(tmp_path: Path, missing: str) -> None:
    spec = secured_spec(tmp_path)
    gone = Path(getattr(spec, missing))
    gone.unlink()
    with pytest.raises(UserError) as err:
        export_manifests(spec, K8sOptions(), AlertSettings())
    assert err.value.message.startswith(f"{missing} {gone} does not exist")


@pytest.mark.hostile("export k8s: a keys file the gateway would refuse, or a certificate not matching its key")
@pytest.mark.parametrize("breakage, message", [("keys", "keys_file: "), ("tls", "ssl_certfile/ssl_keyfile: ")])
def test_files_the_gateway_would_refuse_stop_the_export(tmp_path: Path, breakage: str, message: str) -> None:
    spec = secured_spec(tmp_path)
    if breakage == "keys":
        Path(spec.keys_file or "").write_text("tenants: [{name: a, keys: [k]}, {name: b, keys: [k]}]\n")
    else:
        other = tmp_path / "other"
        other.mkdir()
        _, other_key = self_signed_certificate(other)
        Path(spec.ssl_keyfile or "").write_bytes(other_key.read_bytes())
    with pytest.raises(UserError) as err:
        export_manifests(spec, K8sOptions(), AlertSettings())
    assert err.value.message.startswith(message) and "\n" not in err.value.message


@pytest.mark.hostile("export k8s: keys or an audit log asked for with the gateway off")
def test_gateway_settings_without_a_gateway_are_refused(tmp_path: Path) -> None:
    spec = secured_spec(tmp_path, gateway=False)
    with pytest.raises(UserError, match="keys_file, audit_log, ssl_certfile need the gateway, which is off"):
        export_manifests(spec, K8sOptions(), AlertSettings())


@pytest.mark.hostile("export k8s: a namespace or claim name Kubernetes would refuse")
@pytest.mark.parametrize(
    "options, flag",
    [
        (K8sOptions(namespace="Vision_Team"), "--namespace"),
        (K8sOptions(monitoring_namespace="monitoring; x"), "--monitoring-namespace"),
        (K8sOptions(audit_pvc="-audit"), "--audit-pvc"),
    ],
)
def test_names_kubernetes_would_refuse_are_one_line(options: K8sOptions, flag: str) -> None:
    spec = DeploymentSpec.model_validate({"name": "radiology", "model": "org/vlm"})
    with pytest.raises(UserError) as err:
        export_manifests(spec, options, AlertSettings())
    assert err.value.message.startswith(f"{flag} ") and "is not a Kubernetes name" in err.value.message


def test_cli_prints_the_secret_commands_and_writes_no_key_material(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = secured_spec(tmp_path)
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    out = tmp_path / "k8s"
    code, stdout, stderr = run_cli(["export", "k8s", "-f", str(spec_file), "--out", str(out), "--namespace", "vision"], capsys)
    assert code == 0, stderr
    assert "warning: audit_log goes to an emptyDir" in stderr
    assert "kubectl create secret tls radiology-gateway-tls --namespace vision" in stdout
    script = out / "create-secrets.sh"
    assert stat.S_IMODE(script.stat().st_mode) == 0o700
    assert "kubectl create secret generic radiology-gateway-keys" in script.read_text()
    for path in out.iterdir():
        assert "sk-radiology-secret-1" not in path.read_text(), path
    resources = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    assert "create-secrets.sh" not in resources and "engine-networkpolicy.yaml" in resources
    for name in resources:
        validate(yaml.safe_load((out / name).read_text()))


def test_cli_embedded_secrets_are_readable_by_their_owner_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = secured_spec(tmp_path)
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    out = tmp_path / "k8s"
    code, stdout, stderr = run_cli(
        ["export", "k8s", "-f", str(spec_file), "--out", str(out), "--embed-secrets", "--audit-pvc", "audit-logs"], capsys
    )
    assert code == 0, stderr
    assert "kubectl create secret" not in stdout and not (out / "create-secrets.sh").exists()
    assert "audit_log" not in stderr  # kept on the claim: nothing to warn about
    for name in ("gateway-keys-secret.yaml", "gateway-tls-secret.yaml", "redis-secret.yaml"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert "sk-radiology-secret-1" in (out / "gateway-keys-secret.yaml").read_text()


@pytest.mark.hostile("export k8s: the spec names a keys file that does not exist (CLI)")
def test_cli_missing_keys_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("name: radiology\nengine: sim\nmodel: m\nkeys_file: keys.yaml\n")
    code, stdout, stderr = run_cli(["export", "k8s", "-f", str(spec_file), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and not (tmp_path / "out").exists()
    assert (
        stderr == f"error: keys_file {tmp_path / 'keys.yaml'} does not exist; create it or fix the path "
        "(relative paths are read next to the spec file)\n"
    )


def test_the_media_allowlist_and_image_limits_reach_the_gateway_as_up_passes_them() -> None:
    spec = DeploymentSpec.model_validate(
        {
            "name": "radiology",
            "engine": "sim",
            "model": "m",
            "allowed_media_domains": ["images.example.com"],
            "max_image_bytes": 2_000_000,
            "max_images_per_request": 2,
            "image_downscale_max_side": 1024,
        }
    )
    container = pod(render_manifests(spec, K8sOptions(), AlertSettings())["gateway-deployment.yaml"])["containers"][0]
    params = gateway_params(container["args"])
    assert params["allowed_media_domains"] == ["images.example.com"]
    assert (params["max_image_bytes"], params["max_images_per_request"], params["image_downscale_max_side"]) == (
        2_000_000,
        2,
        1024,
    )
    assert params["allow_internal_media_addresses"] is False


@pytest.mark.parametrize(
    "file_name, break_it",
    [
        ("servicemonitor.yaml", lambda m: m["spec"]["endpoints"][0].update(intervall="15s")),  # misspelt field
        ("servicemonitor.yaml", lambda m: m["spec"]["endpoints"][0].update(scheme="ftp")),  # not in the enum
        ("prometheusrule.yaml", lambda m: m["spec"]["groups"][0].update(interval="5 minutes")),  # not a duration
        ("engine-scaledobject.yaml", lambda m: m["spec"].update(minReplicaCount="2")),  # a string for an integer
        ("engine-scaledobject.yaml", lambda m: m["spec"].update(scaleTargetRef={})),  # required name missing
    ],
)
def test_the_published_crd_schemas_catch_what_a_cluster_would_refuse(file_name: str, break_it: Any) -> None:
    """The vendored schemas are real checks: each of these breaks the object as the CRD defines it."""
    import jsonschema

    spec = DeploymentSpec.model_validate({"name": "radiology", "model": "org/vlm"})
    manifest = render_manifests(spec, K8sOptions(), AlertSettings())[file_name]
    validate(manifest)
    break_it(manifest)
    with pytest.raises(jsonschema.ValidationError):
        validate(manifest)


def test_cli_defaults_to_the_dockerfile_image_and_can_close_the_monitoring_exception(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vlmserve.export.k8s import GATEWAY_IMAGE

    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("name: radiology\nengine: sim\nmodel: m\n")
    out = tmp_path / "k8s"
    code, _, stderr = run_cli(["export", "k8s", "-f", str(spec_file), "--out", str(out), "--monitoring-namespace", ""], capsys)
    assert code == 0, stderr
    gateway = yaml.safe_load((out / "gateway-deployment.yaml").read_text())
    assert pod(gateway)["containers"][0]["image"] == GATEWAY_IMAGE
    policy = yaml.safe_load((out / "engine-networkpolicy.yaml").read_text())
    assert [list(peer) for rule in policy["spec"]["ingress"] for peer in rule["from"]] == [["podSelector"]]
    assert "warning: the spec has no keys_file" in stderr
