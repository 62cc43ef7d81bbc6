"""`vlmserve export k8s --router llm-d`: an InferencePool, its endpoint picker and an HTTPRoute in
place of vlmserve's gateway, every object valid against its published schema (the EPP's plugin
configuration against its Go type), carrying the recipe, the image limit and the autoscaling rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import run_cli
from tests.helpers.crd_schemas import validate, validate_epp_config
from tests.helpers.platform_specs import LOAD_S, MAX_IMAGES, RECIPE_FLAGS, RULE, keys_file, recipe_spec
from vlmserve.autoscale import AutoscaleRule
from vlmserve.errors import UserError
from vlmserve.export.k8s import K8sOptions, rule_from_keda
from vlmserve.export.llmd import EPP_CONFIG_FILE, POLICY_SCORERS, LlmdOptions, endpoint_picker_config, export_llmd
from vlmserve.routing import GATEWAY_POLICIES
from vlmserve.spec import DeploymentSpec


def test_every_object_validates_and_the_pieces_point_at_each_other(tmp_path: Path) -> None:
    spec = recipe_spec(tmp_path)
    found = export_llmd(spec, K8sOptions(namespace="vision", model_pvc="weights"), LlmdOptions(gateway_name="edge"))
    for manifest in found.manifests.values():
        validate(manifest)
    names = found.manifests
    assert not [name for name in names if "gateway" in name or "redis" in name]  # no second router
    pool, route = names["inferencepool.yaml"], names["httproute.yaml"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    # the pool selects exactly the engine pods
    engine_pod_labels = names["engine-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= engine_pod_labels.items()
    epp_pod_labels = names["epp-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert not pool["spec"]["selector"]["matchLabels"].items() <= epp_pod_labels.items()
    # the route sends the Gateway's traffic to the pool, the pool asks the EPP Service on its ext-proc port
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}
    ]
    picker = pool["spec"]["endpointPickerRef"]
    service = names["epp-service.yaml"]
    assert picker["name"] == service["metadata"]["name"]
    assert picker["port"]["number"] in [port["port"] for port in service["spec"]["ports"]]
    assert service["spec"]["selector"] == epp_pod_labels
    # the EPP reads its configuration from the ConfigMap it mounts, for the pool it is named
    epp_pod = names["epp-deployment.yaml"]["spec"]["template"]["spec"]
    args = epp_pod["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    assert args[args.index("--pool-namespace") + 1] == "vision"
    config_path = Path(args[args.index("--config-file") + 1])
    mount = next(m for m in epp_pod["containers"][0]["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in epp_pod["volumes"] if v["name"] == mount["name"])
    configmap = names["epp-configmap.yaml"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"] and config_path.name == EPP_CONFIG_FILE
    validate_epp_config(yaml.safe_load(configmap["data"][EPP_CONFIG_FILE]))
    # the EPP's ServiceAccount may read pods and InferencePools (what it watches), bound to it
    role = names["epp-role.yaml"]
    assert {"pods", "inferencepools"} <= {resource for rule in role["rules"] for resource in rule["resources"]}
    assert names["epp-rolebinding.yaml"]["subjects"][0]["name"] == epp_pod["serviceAccountName"]


def test_the_recipe_image_limit_replicas_and_autoscaling_rule_travel(tmp_path: Path) -> None:
    spec = recipe_spec(tmp_path)
    found = export_llmd(spec, K8sOptions(model_pvc="weights"), LlmdOptions())
    engine = found.manifests["engine-deployment.yaml"]
    args = engine["spec"]["template"]["spec"]["containers"][0]["args"]
    assert engine["spec"]["replicas"] == 2
    assert all(flag in args for flag in RECIPE_FLAGS)
    assert json.loads(args[args.index("--limit-mm-per-prompt") + 1])["image"] == MAX_IMAGES
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    # nothing in front checks processor kwargs any more, so the engine must not trust a request's
    assert "--trust-request-mm-kwargs" not in args
    probe = engine["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= LOAD_S
    assert rule_from_keda(found.manifests["engine-scaledobject.yaml"]["spec"]) == AutoscaleRule(**RULE)
    # what cannot travel is said, on stderr and in the YAML
    assert any("max_image_bytes not enforced" in note for note in found.notes)
    assert "admission control" in found.comments["inferencepool.yaml"]


@pytest.mark.parametrize("policy", GATEWAY_POLICIES)
def test_each_routing_policy_becomes_a_valid_picker_configuration(policy: str) -> None:
    config = endpoint_picker_config(policy)
    validate_epp_config(config)
    declared = {plugin["type"] for plugin in config["plugins"]}
    used = {plugin["pluginRef"] for plugin in config["schedulingProfiles"][0]["plugins"]}
    assert used <= declared
    assert POLICY_SCORERS[policy].picker in used


def test_affinity_policies_map_to_their_scorers() -> None:
    def scorers(policy: str) -> set[str]:
        return {p["pluginRef"] for p in endpoint_picker_config(policy)["schedulingProfiles"][0]["plugins"]}

    assert "prefix-cache-scorer" in scorers("prefix-affinity")
    assert "lora-affinity-scorer" in scorers("adapter-affinity")
    assert scorers("round-robin") == {"random-picker"}


def test_nearest_policy_is_a_warning(tmp_path: Path) -> None:
    spec = recipe_spec(tmp_path, gateway_policy="round-robin")
    notes = export_llmd(spec, K8sOptions(model_pvc="weights"), LlmdOptions()).notes
    assert any("gateway_policy round-robin becomes random-picker" in note for note in notes)


@pytest.mark.hostile("export k8s --router with an unknown router name")
def test_unknown_router_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("model: org/m\n")
    code, _, err = run_cli(["export", "k8s", "-f", str(spec_file), "--out", str(tmp_path / "o"), "--router", "istio"], capsys)
    assert code == 2 and err.strip() == "error: --router 'istio': choose vlmserve or llm-d"
    assert not (tmp_path / "o").exists()


@pytest.mark.hostile("export k8s: llm-d-only flags given with the vlmserve router")
def test_llmd_flags_without_llmd_router_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("model: org/m\n")
    code, _, err = run_cli(["export", "k8s", "-f", str(spec_file), "--out", str(tmp_path / "o"), "--epp-image", "x:1"], capsys)
    assert code == 2 and err.strip() == "error: --epp-image only apply with --router llm-d"


@pytest.mark.hostile("export k8s --router llm-d with flags that configure vlmserve's gateway")
def test_gateway_flags_with_llmd_router_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("model: org/m\n")
    code, _, err = run_cli(
        [
            "export",
            "k8s",
            "-f",
            str(spec_file),
            "--out",
            str(tmp_path / "o"),
            "--router",
            "llm-d",
            "--embed-secrets",
            "--discovery",
            "k8s",
        ],
        capsys,
    )
    assert code == 2
    assert err.strip() == "error: --embed-secrets, --discovery only apply with --router vlmserve (they configure its gateway)"


@pytest.mark.hostile("export k8s --router llm-d of a spec with API keys the platform cannot carry")
def test_keys_are_refused_unless_dropped_on_purpose(tmp_path: Path) -> None:
    spec = DeploymentSpec(model="org/m", keys_file=keys_file(tmp_path), audit_log=str(tmp_path / "a.jsonl"))
    with pytest.raises(
        UserError,
        match=r"^llm-d has no vlmserve gateway to carry keys_file, audit_log; "
        r"configure them on the platform's own gateway and pass --drop-gateway-settings",
    ):
        export_llmd(spec, K8sOptions(), LlmdOptions())
    found = export_llmd(spec, K8sOptions(), LlmdOptions(drop_gateway_settings=True))
    assert sum("is not carried (no vlmserve gateway)" in note for note in found.notes) == 2
    assert "keys_file from the spec (not carried)" in found.comments["httproute.yaml"]


@pytest.mark.hostile("export k8s --router llm-d with a Gateway name Kubernetes refuses")
def test_bad_gateway_name_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--gateway-name 'Edge_GW' is not a Kubernetes name"):
        export_llmd(DeploymentSpec(model="org/m"), K8sOptions(), LlmdOptions(gateway_name="Edge_GW"))


def test_cli_writes_the_comment_and_the_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text("name: radiology\nmodel: org/m\nmax_image_pixels: 1000000\n")
    out = tmp_path / "llmd"
    code, stdout, err = run_cli(["export", "k8s", "-f", str(spec_file), "--out", str(out), "--router", "llm-d"], capsys)
    assert code == 0, err
    assert "warning: llm-d: max_image_pixels not enforced" in err
    text = (out / "inferencepool.yaml").read_text()
    assert text.startswith("# vlmserve export k8s --router llm-d") and "the audit log" in text
    names = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    for name in names:
        validate(yaml.safe_load((out / name).read_text()))
    assert "inferencepool.yaml" in names and "httproute.yaml" in names
