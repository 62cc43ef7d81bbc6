"""`vlmserve export production-stack`: Helm values that pass the vllm-stack chart's own values schema
(strict: an undeclared key fails) and carry the engine's flags, resources, replicas and autoscaling."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helpers.cli import run_cli
from tests.helpers.crd_schemas import validate_helm_values
from tests.helpers.platform_specs import LOAD_S, MAX_IMAGES, RECIPE_FLAGS, RULE, keys_file, recipe_spec
from vlmserve.autoscale import AutoscaleRule
from vlmserve.errors import UserError
from vlmserve.export.k8s import K8sOptions, keda_scaled_object_spec
from vlmserve.export.production_stack import CHART_TRIGGER_THRESHOLD, ROUTING_LOGIC, export_production_stack, image_parts
from vlmserve.routing import GATEWAY_POLICIES
from vlmserve.spec import DeploymentSpec

CHART_WRITES = (
    "--tensor-parallel-size",
    "--max-model-len",
    "--dtype",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--model",
    "--host",
    "--port",
)
"""Flags the chart's template writes itself (from vllmConfig keys and modelURL): never in extraArgs too."""


def model_entry(values: dict) -> dict:
    return values["servingEngineSpec"]["modelSpec"][0]


def test_values_validate_and_carry_the_engine(tmp_path: Path) -> None:
    spec = recipe_spec(tmp_path)
    found = export_production_stack(
        spec,
        K8sOptions(model_pvc="weights", vllm_image="vllm/vllm-openai:v0.11.0", hf_token_secret="hf"),
        drop_gateway_settings=False,
    )
    validate_helm_values(found.values)
    entry = model_entry(found.values)
    assert (entry["repository"], entry["tag"]) == ("vllm/vllm-openai", "v0.11.0")
    assert entry["modelURL"] == "/models/gemma-4-31b-it"  # the weights folder on its claim
    assert entry["extraVolumes"][0]["persistentVolumeClaim"]["claimName"] == "weights"
    assert entry["extraVolumeMounts"][0]["mountPath"] == "/models"
    assert entry["replicaCount"] == 2
    assert (entry["requestGPU"], entry["requestCPU"], entry["requestMemory"]) == (2, 8, "32Gi")
    config = entry["vllmConfig"]
    assert (config["tensorParallelSize"], config["maxModelLen"]) == (2, 8192)
    assert config["enablePrefixCaching"] is True  # vLLM's default: the chart would otherwise turn it off
    extra = config["extraArgs"]
    assert all(flag in extra for flag in RECIPE_FLAGS)
    assert json.loads(extra[extra.index("--limit-mm-per-prompt") + 1])["image"] == MAX_IMAGES
    assert not [flag for flag in CHART_WRITES if flag in extra]
    assert "--trust-request-mm-kwargs" not in extra
    assert entry["hf_token"] == {"secretName": "hf", "secretKey": "token"}
    assert entry["env"] == [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}]
    probe = found.values["servingEngineSpec"]["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= LOAD_S


def test_autoscaling_bounds_and_behaviour_travel_and_the_threshold_is_a_warning(tmp_path: Path) -> None:
    spec = recipe_spec(tmp_path)
    found = export_production_stack(spec, K8sOptions(model_pvc="weights"), drop_gateway_settings=False)
    keda = model_entry(found.values)["keda"]
    rule = AutoscaleRule(**RULE)
    assert keda["enabled"] is True
    assert (keda["minReplicaCount"], keda["maxReplicaCount"], keda["pollingInterval"]) == (2, 7, 10)
    expected = keda_scaled_object_spec(rule, "", "", "")["advanced"]["horizontalPodAutoscalerConfig"]
    assert keda["advanced"]["horizontalPodAutoscalerConfig"] == expected
    assert "triggers" not in keda  # the chart's schema and template disagree on its shape
    assert any("threshold 3 waiting requests per replica is not carried" in note for note in found.notes)
    at_default = recipe_spec(tmp_path / "b", autoscale={**RULE, "waiting_per_replica": CHART_TRIGGER_THRESHOLD})
    notes = export_production_stack(at_default, K8sOptions(model_pvc="weights"), drop_gateway_settings=False).notes
    assert not [note for note in notes if "threshold" in note]


@pytest.mark.parametrize("policy", GATEWAY_POLICIES)
def test_each_policy_becomes_a_routing_logic_the_chart_takes(policy: str) -> None:
    found = export_production_stack(
        DeploymentSpec(model="org/m", gateway_policy=policy), K8sOptions(), drop_gateway_settings=False
    )
    validate_helm_values(found.values)
    logic, differs = ROUTING_LOGIC[policy]
    assert found.values["routerSpec"]["routingLogic"] == logic
    assert any(f"becomes routingLogic {logic}" in note for note in found.notes) == bool(differs)


def test_the_strict_schema_check_is_not_vacuous() -> None:
    values = export_production_stack(DeploymentSpec(model="org/m"), K8sOptions(), drop_gateway_settings=False).values
    typo = copy.deepcopy(values)
    model_entry(typo)["replicas"] = 2  # the chart's key is replicaCount
    with pytest.raises(jsonschema.ValidationError, match="'replicas' was unexpected"):
        validate_helm_values(typo)
    wrong_type = copy.deepcopy(values)
    model_entry(wrong_type)["requestCPU"] = "8"
    with pytest.raises(jsonschema.ValidationError):
        validate_helm_values(wrong_type)


def test_image_reference_parts() -> None:
    assert image_parts("vllm/vllm-openai") == ("vllm/vllm-openai", "latest")
    assert image_parts("registry.example.com:5000/vllm:v1") == ("registry.example.com:5000/vllm", "v1")


@pytest.mark.hostile("export production-stack with an image pinned by digest, which the chart cannot take")
def test_digest_image_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--vllm-image vllm/vllm-openai@sha256:ab: the chart takes repository and tag"):
        export_production_stack(
            DeploymentSpec(model="org/m"), K8sOptions(vllm_image="vllm/vllm-openai@sha256:ab"), drop_gateway_settings=False
        )


@pytest.mark.hostile("export production-stack of a sim-engine spec")
def test_sim_engine_is_refused() -> None:
    with pytest.raises(UserError, match=r"^production-stack runs vLLM images; engine: sim"):
        export_production_stack(DeploymentSpec(model="sim-vlm", engine="sim"), K8sOptions(), drop_gateway_settings=False)


@pytest.mark.hostile("export production-stack of a spec with API keys and TLS the chart cannot carry")
def test_trust_settings_refused_then_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "radiology", "model": "org/m", "keys_file": keys_file(tmp_path)}))
    out = tmp_path / "values.yaml"
    code, _, err = run_cli(["export", "production-stack", "-f", str(spec_file), "--out", str(out)], capsys)
    assert code == 2 and err.strip().startswith("error: production-stack has no vlmserve gateway to carry keys_file;")
    assert not out.exists()
    code, _, err = run_cli(
        ["export", "production-stack", "-f", str(spec_file), "--out", str(out), "--drop-gateway-settings"], capsys
    )
    assert code == 0, err
    assert "warning: production-stack: keys_file is not carried" in err
    text = out.read_text()
    assert text.startswith("# vlmserve export production-stack") and "keys_file from the spec (not carried)" in text
    validate_helm_values(yaml.safe_load(text))
