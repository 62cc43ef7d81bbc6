"""The trust boundary of a Kubernetes export: the gateway's keys, TLS and audit log, a Redis password,
and NetworkPolicies that leave the gateway the only way to the engines.

The spec's `keys_file`, `ssl_certfile`/`ssl_keyfile` and `audit_log` reach the gateway pods as the
same flags `vlmserve up` passes (`GATEWAY_FILE_FLAGS`), pointing at Secret volumes (keys, TLS) and
an audit volume (a PersistentVolumeClaim, or an emptyDir that a restart empties, with a warning).

Key material stays out of the manifest folder by default: the export prints (and writes to
`create-secrets.sh`) the `kubectl create secret` commands that read the files where they are, so
the manifests can be committed, reviewed and shared. `--embed-secrets` writes Secret manifests
with the files' content instead, for a throw-away cluster or a sealed-secrets pipeline.

Every file is checked here, before anything is written: a missing file, a keys file the gateway
would refuse, or a certificate and key that do not belong together stop the export with one line.
"""

from __future__ import annotations

import base64
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vlmserve.errors import UserError
from vlmserve.gateway.admission import load_keys_file
from vlmserve.gateway.config import GATEWAY_FILE_FLAGS
from vlmserve.http1.tls import server_ssl_context
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.spec import DeploymentSpec

if TYPE_CHECKING:
    from vlmserve.export.k8s import K8sOptions

KEYS_MOUNT = "/etc/vlmserve/keys"
KEYS_SECRET_KEY = "keys.yaml"
TLS_MOUNT = "/etc/vlmserve/tls"
TLS_CERT_KEY = "tls.crt"  # the key names of a kubernetes.io/tls Secret
TLS_KEY_KEY = "tls.key"
AUDIT_MOUNT = "/var/log/vlmserve"
POD_NAME_ENV = "POD_NAME"  # each gateway pod writes its own audit file: two never interleave lines
REDIS_PASSWORD_ENV = "REDIS_PASSWORD"
REDIS_PASSWORD_KEY = "password"
REDIS_PASSWORD_BYTES = 24  # hex: no character that would need escaping in the state URL
REDIS_CLI_AUTH_ENV = "REDISCLI_AUTH"  # redis-cli (the probes) reads the password from here
MONITORING_NAMESPACE = "monitoring"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_FILE_SETTINGS = ("keys_file", "ssl_certfile", "ssl_keyfile")
_GATEWAY_ONLY = ("keys_file", "audit_log", "ssl_certfile")


def keys_secret_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-gateway-keys"


def tls_secret_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-gateway-tls"


def redis_secret_name(spec: DeploymentSpec) -> str:
    return f"{spec.name}-redis"


@dataclass
class GatewaySecurity:
    """What the trust settings add to the gateway pod: flags, environment, volumes and mounts."""

    args: list[str] = field(default_factory=list)
    env: list[JSONValue] = field(default_factory=list)
    volumes: list[JSONValue] = field(default_factory=list)
    mounts: list[JSONValue] = field(default_factory=list)
    tls: bool = False


def check_dns_label(flag: str, value: str) -> str:
    """A namespace or object name as Kubernetes accepts it (RFC 1123 label), else one line."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise UserError(
            f"{flag} {value!r} is not a Kubernetes name: use lower-case letters, digits and '-' "
            "(at most 63, starting and ending with a letter or digit)"
        )
    return value


def check_trust_settings(spec: DeploymentSpec) -> None:
    """The spec's gateway files exist and the gateway would accept them, checked before any manifest is written.

    A keys file the gateway refuses, or a certificate that does not match its key, would otherwise
    surface as gateway pods crash-looping in the cluster."""
    given = [name for name in _GATEWAY_ONLY if getattr(spec, name)]
    if given and not spec.gateway:
        raise UserError(
            f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} the gateway, which is off "
            "(gateway: false); set gateway: true to export them"
        )
    for name in _FILE_SETTINGS:
        value = getattr(spec, name)
        if value and not Path(value).expanduser().is_file():
            raise UserError(
                f"{name} {value} does not exist; create it or fix the path (relative paths are read next to the spec file)"
            )
    if spec.keys_file:
        try:
            load_keys_file(Path(spec.keys_file).expanduser())
        except UserError as err:
            raise UserError(f"keys_file: {err.message}") from None
    if spec.ssl_certfile and spec.ssl_keyfile:
        try:
            server_ssl_context(Path(spec.ssl_certfile).expanduser(), Path(spec.ssl_keyfile).expanduser())
        except UserError as err:
            raise UserError(f"ssl_certfile/ssl_keyfile: {err.message}") from None


def gateway_security(spec: DeploymentSpec, options: K8sOptions) -> GatewaySecurity:
    """The gateway flags and volumes for the spec's keys, TLS and audit log, plus the Redis password
    its state URL carries (through the environment, as `up` passes it: never in the pod's args)."""
    found = GatewaySecurity()
    flags = GATEWAY_FILE_FLAGS
    if spec.keys_file:
        found.volumes.append({"name": "gateway-keys", "secret": {"secretName": keys_secret_name(spec), "defaultMode": 0o440}})
        found.mounts.append({"name": "gateway-keys", "mountPath": KEYS_MOUNT, "readOnly": True})
        found.args += [flags["keys_file"], f"{KEYS_MOUNT}/{KEYS_SECRET_KEY}"]
    if spec.ssl_certfile:
        found.tls = True
        found.volumes.append({"name": "gateway-tls", "secret": {"secretName": tls_secret_name(spec), "defaultMode": 0o440}})
        found.mounts.append({"name": "gateway-tls", "mountPath": TLS_MOUNT, "readOnly": True})
        found.args += [flags["ssl_certfile"], f"{TLS_MOUNT}/{TLS_CERT_KEY}", flags["ssl_keyfile"], f"{TLS_MOUNT}/{TLS_KEY_KEY}"]
    if spec.audit_log:
        source: JSONObject = (
            {"persistentVolumeClaim": {"claimName": options.audit_pvc}} if options.audit_pvc else {"emptyDir": {}}
        )
        found.volumes.append({"name": "audit", **source})
        found.mounts.append({"name": "audit", "mountPath": AUDIT_MOUNT})
        found.env.append({"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        found.args += [flags["audit_log"], f"{AUDIT_MOUNT}/{audit_file_name(spec)}"]
    found.env.append(redis_password_env(spec))
    return found


def audit_file_name(spec: DeploymentSpec) -> str:
    """`<spec's file name stem>-$(POD_NAME).jsonl`: Kubernetes expands the pod's name into the argument."""
    stem = Path(spec.audit_log or "audit").stem or "audit"
    return f"{stem}-$({POD_NAME_ENV}).jsonl"


def redis_password_env(spec: DeploymentSpec, name: str = REDIS_PASSWORD_ENV) -> JSONObject:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": redis_secret_name(spec), "key": REDIS_PASSWORD_KEY}}}


def trust_warnings(spec: DeploymentSpec, options: K8sOptions) -> list[str]:
    """What the export carries but cannot make safe: said once, on stderr."""
    warnings = []
    if spec.audit_log and not options.audit_pvc:
        warnings.append(
            "warning: audit_log goes to an emptyDir in each gateway pod and is lost when the pod "
            "restarts or moves; pass --audit-pvc NAME (a ReadWriteMany claim) to keep it"
        )
    if not spec.gateway:
        warnings.append(
            "warning: gateway: false: the engine pods are the way in, open to every pod in the "
            "cluster with no keys and no NetworkPolicy; set gateway: true for a guarded service"
        )
    elif not spec.keys_file:
        warnings.append(
            "warning: the spec has no keys_file: the gateway admits every client that reaches "
            "its Service; set keys_file to ask for API keys"
        )
    return warnings


def _secret(spec: DeploymentSpec, options: K8sOptions, name: str, body: JSONObject) -> JSONObject:
    labels: JSONObject = {"app.kubernetes.io/name": "vlmserve", "app.kubernetes.io/instance": spec.name}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        **body,
    }


def embedded_secrets(spec: DeploymentSpec, options: K8sOptions) -> dict[str, JSONObject]:
    """`--embed-secrets`: Secret manifests holding the files' content and a fresh Redis password."""
    manifests: dict[str, JSONObject] = {}
    if spec.gateway:
        password = secrets.token_hex(REDIS_PASSWORD_BYTES)
        manifests["redis-secret.yaml"] = _secret(
            spec, options, redis_secret_name(spec), {"type": "Opaque", "stringData": {REDIS_PASSWORD_KEY: password}}
        )
    if spec.keys_file:
        text = Path(spec.keys_file).expanduser().read_text(encoding="utf-8")
        manifests["gateway-keys-secret.yaml"] = _secret(
            spec, options, keys_secret_name(spec), {"type": "Opaque", "stringData": {KEYS_SECRET_KEY: text}}
        )
    if spec.ssl_certfile and spec.ssl_keyfile:
        data: JSONObject = {
            key: base64.b64encode(Path(path).expanduser().read_bytes()).decode("ascii")
            for key, path in ((TLS_CERT_KEY, spec.ssl_certfile), (TLS_KEY_KEY, spec.ssl_keyfile))
        }
        manifests["gateway-tls-secret.yaml"] = _secret(
            spec, options, tls_secret_name(spec), {"type": "kubernetes.io/tls", "data": data}
        )
    return manifests


def secret_commands(spec: DeploymentSpec, options: K8sOptions) -> list[str]:
    """The `kubectl create secret` commands that put the spec's files (and a Redis password) into the
    cluster without writing their content anywhere else; run them before `kubectl apply -k`."""
    ns = shlex.quote(options.namespace)
    commands = []
    if spec.gateway:
        commands.append(
            f"kubectl create secret generic {redis_secret_name(spec)} --namespace {ns} "
            f'--from-literal={REDIS_PASSWORD_KEY}="$(openssl rand -hex {REDIS_PASSWORD_BYTES})"'
        )
    if spec.keys_file:
        path = shlex.quote(str(Path(spec.keys_file).expanduser().resolve()))
        commands.append(
            f"kubectl create secret generic {keys_secret_name(spec)} --namespace {ns} --from-file={KEYS_SECRET_KEY}={path}"
        )
    if spec.ssl_certfile and spec.ssl_keyfile:
        cert = shlex.quote(str(Path(spec.ssl_certfile).expanduser().resolve()))
        key = shlex.quote(str(Path(spec.ssl_keyfile).expanduser().resolve()))
        commands.append(f"kubectl create secret tls {tls_secret_name(spec)} --namespace {ns} --cert={cert} --key={key}")
    return commands


def _policy(
    spec: DeploymentSpec, options: K8sOptions, name: str, pods: Mapping[str, str], ingress: list[JSONValue]
) -> JSONObject:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": options.namespace, "labels": {**pods}},
        "spec": {"podSelector": {"matchLabels": {**pods}}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def engine_network_policy(
    spec: DeploymentSpec, options: K8sOptions, engine_pods: Mapping[str, str], gateway_pods: Mapping[str, str], engine_port: int
) -> JSONObject:
    """Only the gateway pods reach the engines, so no client goes around its keys, limits and audit;
    the one exception is Prometheus's namespace, for /metrics (a NetworkPolicy cannot pick a path:
    that namespace may reach the engine's port, which is why it is a flag, and may be turned off)."""
    port: list[JSONValue] = [{"protocol": "TCP", "port": engine_port}]
    ingress: list[JSONValue] = [{"from": [{"podSelector": {"matchLabels": {**gateway_pods}}}], "ports": port}]
    if options.monitoring_namespace:
        ingress.append(
            {
                "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: options.monitoring_namespace}}}],
                "ports": port,
            }
        )
    return _policy(spec, options, f"{spec.name}-engine", engine_pods, ingress)


def redis_network_policy(
    spec: DeploymentSpec, options: K8sOptions, redis_pods: Mapping[str, str], gateway_pods: Mapping[str, str], redis_port: int
) -> JSONObject:
    """Only the gateway pods reach Redis (its password is the second lock)."""
    return _policy(
        spec,
        options,
        f"{spec.name}-redis",
        redis_pods,
        [{"from": [{"podSelector": {"matchLabels": {**gateway_pods}}}], "ports": [{"protocol": "TCP", "port": redis_port}]}],
    )
