"""`vlmserve export k8s`: render a DeploymentSpec as Kubernetes manifests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from vlmserve.cli.model_options import GROUP, Flag, OptionGroup, with_groups
from vlmserve.errors import UserError
from vlmserve.export.platform_engine import DROP_FLAG

if TYPE_CHECKING:
    from vlmserve.export.k8s import K8sExport, K8sOptions
    from vlmserve.observe.alerts import AlertSettings
    from vlmserve.spec import DeploymentSpec

DROP_HELP = (
    "Export a spec with keys_file, TLS or audit_log although the platform has no vlmserve gateway to "
    "carry them (each is named in a warning); without it such a spec is refused."
)

export_app = typer.Typer(help="Export a deployment to other platforms.", no_args_is_help=True)


def _parse_label(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise UserError(f"--monitoring-label: '{text}' has no '='; write it like release=kube-prometheus-stack")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


K8S = OptionGroup(
    "flags",
    {
        # every `vlmserve export k8s` flag once, in its --help order
        "spec_file": Flag(typer.Option(..., "-f", "--file", help="Deployment spec (deploy.yaml)."), Path),
        "out": Flag(typer.Option(..., "--out", help="Folder to write the manifests into."), Path),
        "namespace": Flag(typer.Option("default", "--namespace", help="Namespace of every object."), str),
        "vllm_image": Flag(typer.Option("vllm/vllm-openai:latest", "--vllm-image", help="Engine image (pin a tag)."), str),
        "vlmserve_image": Flag(
            typer.Option(
                None,
                "--vlmserve-image",
                help="Image with vlmserve installed (gateway, sim engine); default: vlmserve:<version>, what the repository's Dockerfile builds.",
            ),
            Optional[str],
        ),
        "model_pvc": Flag(
            typer.Option(None, "--model-pvc", help="PersistentVolumeClaim holding a local weights folder."), Optional[str]
        ),
        "hf_token_secret": Flag(
            typer.Option(None, "--hf-token-secret", help="Secret with key 'token' for gated Hugging Face models."), Optional[str]
        ),
        "max_replicas": Flag(
            typer.Option(
                None, "--max-replicas", min=1, help="KEDA upper bound (default: the spec's autoscale rule, else 4x replicas)."
            ),
            Optional[int],
        ),
        "waiting_per_replica": Flag(
            typer.Option(
                None,
                "--waiting-per-replica",
                min=0.001,
                help="Queued requests per replica before KEDA adds one (default: the spec's autoscale rule, else 5).",
            ),
            Optional[float],
        ),
        "prometheus_url": Flag(
            typer.Option(
                "http://prometheus-operated.monitoring.svc:9090", "--prometheus-url", help="Prometheus that KEDA queries."
            ),
            str,
        ),
        "monitoring_label": Flag(
            typer.Option(
                [],
                "--monitoring-label",
                help="KEY=VALUE label your Prometheus Operator selects on (e.g. release=kube-prometheus-stack); repeatable.",
            ),
            list[str],
        ),
        "ttft_slo": Flag(typer.Option("500ms", "--ttft-slo", help="p95 TTFT objective in the PrometheusRule."), str),
        "discovery": Flag(
            typer.Option(
                "dns",
                "--discovery",
                help="How the gateways find the engine pods: dns (the headless Service's records) or k8s (its EndpointSlices; adds a ServiceAccount, Role and RoleBinding).",
            ),
            str,
        ),
        "redis_image": Flag(typer.Option("redis:7-alpine", "--redis-image", help="Image of the Redis the gateways share."), str),
        "embed_secrets": Flag(
            typer.Option(
                False,
                "--embed-secrets",
                help="Write the keys file, TLS pair and a Redis password into Secret manifests (key material in --out); default: print the kubectl commands that create them from the files.",
            ),
            bool,
        ),
        "audit_pvc": Flag(
            typer.Option(
                None,
                "--audit-pvc",
                help="ReadWriteMany PersistentVolumeClaim for the gateways' audit logs (default: an emptyDir, lost when a pod restarts).",
            ),
            Optional[str],
        ),
        "monitoring_namespace": Flag(
            typer.Option(
                "monitoring",
                "--monitoring-namespace",
                help="Namespace whose pods (Prometheus) may reach the engines' port for /metrics; '' lets only the gateways in.",
            ),
            str,
        ),
        "router": Flag(
            typer.Option(
                "vlmserve",
                "--router",
                help="What routes requests to the engines: vlmserve (its gateway, Redis and NetworkPolicies) or llm-d (an InferencePool, its endpoint picker and an HTTPRoute from your Gateway; no vlmserve gateway).",
            ),
            str,
        ),
        "epp_image": Flag(
            typer.Option(None, "--epp-image", help="--router llm-d: endpoint-picker image (default: the one KServe v0.20 pins)."),
            Optional[str],
        ),
        "gateway_name": Flag(
            typer.Option(
                None,
                "--gateway-name",
                help="--router llm-d: the Gateway (same namespace) the HTTPRoute attaches to (default: inference-gateway).",
            ),
            Optional[str],
        ),
        "drop_gateway_settings": Flag(typer.Option(False, DROP_FLAG, help=DROP_HELP), bool),
    },
)


@export_app.command("k8s")
@with_groups(K8S)
def k8s(flags: dict[str, Any] = GROUP) -> None:
    """Write Deployments, Services (Redis for the gateways' shared state), a KEDA ScaledObject, a ServiceMonitor and a PrometheusRule."""
    from vlmserve.observe.alerts import AlertSettings
    from vlmserve.spec import load_deployment_spec, parse_duration_s

    spec = load_deployment_spec(flags["spec_file"])
    try:
        slo_s = parse_duration_s(flags["ttft_slo"])
    except ValueError as err:
        raise UserError(f"--ttft-slo: {err}") from None
    llmd_flags = {
        "--epp-image": flags["epp_image"],
        "--gateway-name": flags["gateway_name"],
        DROP_FLAG: flags["drop_gateway_settings"],
    }
    gateway_flags = {
        "--embed-secrets": flags["embed_secrets"],
        "--audit-pvc": flags["audit_pvc"],
        "--discovery": flags["discovery"] != "dns",
    }
    export = _routed_export(
        spec, _k8s_options(flags), AlertSettings(ttft_slo_s=slo_s), flags["router"], llmd_flags, gateway_flags
    )
    _write_export(export, flags["out"])


def _k8s_options(flags: dict[str, Any]) -> "K8sOptions":
    """The K8sOptions `export k8s`'s flags set (the image default kept where --vlmserve-image is not given)."""
    from vlmserve.export.k8s import K8sOptions

    image = {"vlmserve_image": flags["vlmserve_image"]} if flags["vlmserve_image"] else {}
    same = (
        "namespace",
        "vllm_image",
        "model_pvc",
        "hf_token_secret",
        "max_replicas",
        "waiting_per_replica",
        "prometheus_url",
        "discovery",
        "redis_image",
        "embed_secrets",
        "audit_pvc",
    )
    return K8sOptions(
        **{name: flags[name] for name in same},
        **image,
        monitoring_labels=tuple(_parse_label(text) for text in flags["monitoring_label"]),
        monitoring_namespace=flags["monitoring_namespace"] or None,
    )


def _routed_export(
    spec: "DeploymentSpec",
    options: "K8sOptions",
    alerts: "AlertSettings",
    router: str,
    llmd_flags: dict[str, object],
    gateway_flags: dict[str, object],
) -> "K8sExport":
    """The manifests for the chosen router, after refusing flags that only the other router reads."""
    from vlmserve.export.k8s import export_manifests
    from vlmserve.export.llmd import ROUTERS, LlmdOptions, export_llmd

    if router not in ROUTERS:
        raise UserError(f"--router {router!r}: choose {' or '.join(ROUTERS)}")
    llmd_only = [flag for flag, value in llmd_flags.items() if value]
    if router == "vlmserve" and llmd_only:
        raise UserError(f"{', '.join(llmd_only)} only apply with --router llm-d")
    gateway_only = [flag for flag, given in gateway_flags.items() if given]
    if router == "llm-d" and gateway_only:
        raise UserError(f"{', '.join(gateway_only)} only apply with --router vlmserve (they configure its gateway)")
    if router == "vlmserve":
        return export_manifests(spec, options, alerts)
    given = {
        field: str(llmd_flags[flag])
        for field, flag in (("epp_image", "--epp-image"), ("gateway_name", "--gateway-name"))
        if llmd_flags[flag]
    }
    llmd = LlmdOptions(**given, drop_gateway_settings=bool(llmd_flags[DROP_FLAG]))
    return export_llmd(spec, options, llmd)


def _write_export(export: "K8sExport", out: Path) -> None:
    """Every manifest, a kustomization naming them, and the Secret-creating script when one is needed."""
    from vlmserve.observe.pack import to_yaml

    manifests = export.manifests
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out: cannot create {out}: {err.strerror}; pick a writable folder") from None
    for note in export.notes:
        typer.echo(note, err=True)
    for name, manifest in manifests.items():
        _write(out / name, export.comments.get(name, "") + to_yaml(manifest), private=manifest["kind"] == "Secret")
        typer.echo(f"wrote {out / name}")
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(manifests)}
    header = next(iter(export.comments.values()), "")
    (out / "kustomization.yaml").write_text(header + to_yaml(kustomization))
    typer.echo(f"wrote {out / 'kustomization.yaml'}")
    if export.secret_commands:
        script = out / SECRETS_SCRIPT
        _write(
            script,
            "#!/bin/sh\n# Create the Secrets the manifests mount; the files are read where they are.\n"
            "set -eu\n" + "".join(f"{line}\n" for line in export.secret_commands),
            private=True,
        )
        typer.echo(f"wrote {script}; first create the Secrets (no key material is in {out}):")
        for line in export.secret_commands:
            typer.echo(f"  {line}")
    typer.echo(f"apply with: kubectl apply -k {out}")


SECRETS_SCRIPT = "create-secrets.sh"


def _platform_options(
    spec_file: Path,
    vllm_image: str,
    namespace: str,
    model_pvc: Optional[str],
    hf_token_secret: Optional[str],
    max_replicas: Optional[int],
    waiting_per_replica: Optional[float],
) -> tuple[Any, Any]:
    """(spec, K8sOptions) for a platform target: the flags it shares with `export k8s`."""
    from vlmserve.export.k8s import K8sOptions
    from vlmserve.spec import load_deployment_spec

    spec = load_deployment_spec(spec_file)
    return spec, K8sOptions(
        namespace=namespace,
        vllm_image=vllm_image,
        model_pvc=model_pvc,
        hf_token_secret=hf_token_secret,
        max_replicas=max_replicas,
        waiting_per_replica=waiting_per_replica,
    )


def _write_document(out: Path, header: str, document: dict, notes: list[str]) -> None:
    """One YAML file: the comment naming what the platform does not carry, then the document."""
    from vlmserve.observe.pack import to_yaml

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + to_yaml(document))
    except OSError as err:
        raise UserError(f"--out: cannot write {out}: {err.strerror}; pick a writable path") from None
    for note in notes:
        typer.echo(note, err=True)
    typer.echo(f"wrote {out}")


_SPEC = typer.Option(..., "-f", "--file", help="Deployment spec (deploy.yaml).")
_VLLM_IMAGE = typer.Option("vllm/vllm-openai:latest", "--vllm-image", help="Engine image (pin a tag).")
_MODEL_PVC = typer.Option(None, "--model-pvc", help="PersistentVolumeClaim holding a local weights folder.")
_HF_SECRET = typer.Option(None, "--hf-token-secret", help="Secret with key 'token' for gated Hugging Face models.")
_MAX_REPLICAS = typer.Option(
    None, "--max-replicas", min=1, help="Autoscaling upper bound (default: the spec's autoscale rule, else 4x replicas)."
)
_WAITING = typer.Option(
    None,
    "--waiting-per-replica",
    min=0.001,
    help="Queued requests per replica before one is added (default: the spec's autoscale rule, else 5).",
)


@export_app.command("production-stack")
def production_stack(
    spec_file: Path = _SPEC,
    out: Path = typer.Option(..., "--out", help="Values file to write (values.yaml)."),
    vllm_image: str = _VLLM_IMAGE,
    model_pvc: Optional[str] = _MODEL_PVC,
    hf_token_secret: Optional[str] = _HF_SECRET,
    max_replicas: Optional[int] = _MAX_REPLICAS,
    waiting_per_replica: Optional[float] = _WAITING,
    drop_gateway_settings: bool = typer.Option(False, DROP_FLAG, help=DROP_HELP),
) -> None:
    """Write Helm values for vllm-project/production-stack's vllm-stack chart (engine, replicas, KEDA, router)."""
    from vlmserve.export.production_stack import export_production_stack

    spec, options = _platform_options(
        spec_file, vllm_image, "default", model_pvc, hf_token_secret, max_replicas, waiting_per_replica
    )
    found = export_production_stack(spec, options, drop_gateway_settings=drop_gateway_settings)
    _write_document(out, found.header, found.values, found.notes)


@export_app.command("kserve")
def kserve(
    spec_file: Path = _SPEC,
    out: Path = typer.Option(..., "--out", help="File to write the LLMInferenceService into."),
    namespace: str = typer.Option("default", "--namespace", help="Namespace of the resource."),
    vllm_image: str = _VLLM_IMAGE,
    model_pvc: Optional[str] = _MODEL_PVC,
    hf_token_secret: Optional[str] = _HF_SECRET,
    max_replicas: Optional[int] = _MAX_REPLICAS,
    waiting_per_replica: Optional[float] = _WAITING,
    drop_gateway_settings: bool = typer.Option(False, DROP_FLAG, help=DROP_HELP),
) -> None:
    """Write a KServe LLMInferenceService (serving.kserve.io/v1alpha2): model, vLLM flags, scaling, llm-d scheduler."""
    from vlmserve.export.kserve import export_kserve

    spec, options = _platform_options(
        spec_file, vllm_image, namespace, model_pvc, hf_token_secret, max_replicas, waiting_per_replica
    )
    found = export_kserve(spec, options, drop_gateway_settings=drop_gateway_settings)
    _write_document(out, found.header, found.resource, found.notes)


def _write(path: Path, text: str, *, private: bool) -> None:
    """A file in --out; Secrets (and the script naming the key files) readable by their owner only."""
    if not private:
        path.write_text(text)
        return
    mode = 0o700 if path.suffix == ".sh" else 0o600
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)  # never readable by others, even briefly
    with os.fdopen(descriptor, "w") as handle:
        os.fchmod(handle.fileno(), mode)  # a file left by an earlier export keeps its old mode otherwise
        handle.write(text)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
