"""`vlmserve export kserve`: an LLMInferenceService that passes KServe's published CRD schema and
carries the model, the vLLM flags with the recipe, the image limit, the pod's resources and the
autoscaling bounds; KServe's CEL rules (which jsonschema does not run) are checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import run_cli
from tests.helpers.crd_schemas import validate, validate_epp_config
from tests.helpers.platform_specs import LOAD_S, MAX_IMAGES, RECIPE_FLAGS, RULE, recipe_spec
from vlmserve.autoscale import AutoscaleRule
from vlmserve.errors import UserError
from vlmserve.export.k8s import K8sOptions, keda_scaled_object_spec
from vlmserve.export.kserve import TEMPLATE_FLAGS, export_kserve
from vlmserve.spec import DeploymentSpec


def check_cel_rules(resource: dict) -> None:
    """The x-kubernetes-validations of LLMInferenceService v1alpha2 (KServe v0.20) that the export can meet."""
    spec = resource["spec"]
    assert not ("replicas" in spec and "scaling" in spec)  # replicas and scaling are mutually exclusive
    scaling = spec.get("scaling")
    if scaling:
        assert "wva" in scaling  # wva is required when scaling is configured
        assert ("hpa" in scaling["wva"]) != ("keda" in scaling["wva"])  # one actuator backend
        assert scaling.get("minReplicas", 1) <= scaling["maxReplicas"]


def test_resource_validates_and_carries_the_engine(tmp_path: Path) -> None:
    spec = recipe_spec(tmp_path)
    found = export_kserve(
        spec, K8sOptions(namespace="vision", model_pvc="weights", hf_token_secret="hf"), drop_gateway_settings=False
    )
    resource = found.resource
    validate(resource)
    check_cel_rules(resource)
    body = resource["spec"]
    assert resource["apiVersion"] == "serving.kserve.io/v1alpha2" and resource["metadata"]["namespace"] == "vision"
    assert body["model"] == {"uri": "pvc://weights/gemma-4-31b-it", "name": spec.model}
    assert body["parallelism"] == {"tensor": 2}
    container = body["template"]["containers"][0]
    assert container["name"] == "main"
    args = container["args"]
    assert all(flag in args for flag in RECIPE_FLAGS)
    assert json.loads(args[args.index("--limit-mm-per-prompt") + 1])["image"] == MAX_IMAGES
    assert args[args.index("--max-model-len") + 1] == "8192"
    # KServe's template writes the model, port, served name and TP itself: never twice
    assert not [flag for flag in (*TEMPLATE_FLAGS, "--model", "--host", "--port") if flag in args]
    assert "--trust-request-mm-kwargs" not in args
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    probe = container["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= LOAD_S
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in container["env"]
    validate_epp_config(body["router"]["scheduler"]["config"]["inline"])


def test_autoscaling_bounds_and_behaviour_travel_the_trigger_is_a_warning(tmp_path: Path) -> None:
    found = export_kserve(recipe_spec(tmp_path), K8sOptions(model_pvc="weights"), drop_gateway_settings=False)
    scaling = found.resource["spec"]["scaling"]
    rule = AutoscaleRule(**RULE)
    assert (scaling["minReplicas"], scaling["maxReplicas"]) == (2, 7)
    behavior = keda_scaled_object_spec(rule, "", "", "")["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert scaling["wva"]["hpa"]["behavior"] == behavior
    assert any(
        "autoscaling trigger (3 waiting requests per replica, read every 10s) is not carried" in note for note in found.notes
    )
    assert "admission control" in found.header


def test_hugging_face_model_and_no_parallelism() -> None:
    found = export_kserve(
        DeploymentSpec(model="Qwen/Qwen2.5-VL-3B-Instruct", recipe=False), K8sOptions(), drop_gateway_settings=False
    )
    validate(found.resource)
    check_cel_rules(found.resource)
    assert found.resource["spec"]["model"]["uri"] == "hf://Qwen/Qwen2.5-VL-3B-Instruct"
    assert "parallelism" not in found.resource["spec"]


@pytest.mark.hostile("export kserve of a local weights folder without a claim to read it from")
def test_local_folder_without_claim_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"is a local folder; copy it to a PersistentVolumeClaim and pass --model-pvc"):
        export_kserve(recipe_spec(tmp_path), K8sOptions(), drop_gateway_settings=False)


@pytest.mark.hostile("export kserve of a spec with TLS and an audit log KServe cannot carry")
def test_trust_settings_refused_then_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.tls import self_signed_certificate

    cert, key = self_signed_certificate(tmp_path)
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "radiology",
                "model": "org/m",
                "ssl_certfile": str(cert),
                "ssl_keyfile": str(key),
                "audit_log": str(tmp_path / "a.jsonl"),
            }
        )
    )
    out = tmp_path / "llmisvc.yaml"
    code, _, err = run_cli(["export", "kserve", "-f", str(spec_file), "--out", str(out)], capsys)
    assert code == 2
    assert err.strip().startswith("error: kserve has no vlmserve gateway to carry ssl_certfile, audit_log;")
    assert not out.exists()
    code, _, err = run_cli(
        ["export", "kserve", "-f", str(spec_file), "--out", str(out), "--drop-gateway-settings", "--namespace", "vision"], capsys
    )
    assert code == 0, err
    text = out.read_text()
    assert "ssl_certfile from the spec (not carried)" in text and "audit_log from the spec (not carried)" in text
    validate(yaml.safe_load(text))


@pytest.mark.hostile("export kserve into a path that cannot be written")
def test_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("model: org/m\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(["export", "kserve", "-f", str(spec_file), "--out", str(blocker / "x.yaml")], capsys)
    assert code == 2 and err.strip().startswith("error: --out: cannot write") and err.count("\n") == 1
