"""The platform targets end to end: `vlmserve export k8s --router llm-d`, `export production-stack` and
`export kserve` run as a user runs them, on a spec whose recipe applies, and what they write validates
against the published schemas and says what it does not carry."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.crd_schemas import validate, validate_epp_config, validate_helm_values
from tests.helpers.platform_specs import RECIPE_FLAGS, recipe_spec

NOT_CARRIED = "# Not expressed on this platform (vlmserve's gateway did these):"


def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(recipe_spec(tmp_path).model_dump(mode="json", exclude_defaults=True)))
    return path


def export(vlmserve_cmd: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*vlmserve_cmd, "export", *args], capture_output=True, text=True, timeout=120)


def test_llmd_router(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    out = tmp_path / "llmd"
    done = export(
        vlmserve_cmd,
        "k8s",
        "-f",
        str(spec_file(tmp_path)),
        "--out",
        str(out),
        "--router",
        "llm-d",
        "--model-pvc",
        "weights",
        "--namespace",
        "vision",
    )
    assert done.returncode == 0, done.stderr
    assert "warning: llm-d: max_image_bytes not enforced" in done.stderr
    names = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    kinds = set()
    for name in names:
        manifest = yaml.safe_load((out / name).read_text())
        validate(manifest)
        kinds.add(manifest["kind"])
        if manifest["kind"] == "ConfigMap":
            validate_epp_config(yaml.safe_load(next(iter(manifest["data"].values()))))
    assert {"InferencePool", "HTTPRoute", "ConfigMap", "ScaledObject"} <= kinds
    assert NOT_CARRIED in (out / "inferencepool.yaml").read_text()
    args = yaml.safe_load((out / "engine-deployment.yaml").read_text())["spec"]["template"]["spec"]["containers"][0]["args"]
    assert all(flag in args for flag in RECIPE_FLAGS)
    if shutil.which("kubectl"):  # kustomize (built into kubectl, offline) reads the folder as `apply -k` will
        built = subprocess.run(["kubectl", "kustomize", str(out)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr
        assert {doc["kind"] for doc in yaml.safe_load_all(built.stdout)} == kinds


def test_production_stack_values(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    out = tmp_path / "values.yaml"
    done = export(vlmserve_cmd, "production-stack", "-f", str(spec_file(tmp_path)), "--out", str(out), "--model-pvc", "weights")
    assert done.returncode == 0, done.stderr
    assert "threshold 3 waiting requests per replica is not carried" in done.stderr
    text = out.read_text()
    assert text.startswith("# vlmserve export production-stack") and NOT_CARRIED in text
    values = yaml.safe_load(text)
    validate_helm_values(values)
    extra = values["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["extraArgs"]
    assert all(flag in extra for flag in RECIPE_FLAGS)


def test_kserve_resource(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    out = tmp_path / "llmisvc.yaml"
    done = export(vlmserve_cmd, "kserve", "-f", str(spec_file(tmp_path)), "--out", str(out), "--model-pvc", "weights")
    assert done.returncode == 0, done.stderr
    assert "warning: kserve: the autoscaling trigger" in done.stderr
    text = out.read_text()
    assert NOT_CARRIED in text
    resource = yaml.safe_load(text)
    validate(resource)
    assert all(flag in resource["spec"]["template"]["containers"][0]["args"] for flag in RECIPE_FLAGS)


@pytest.mark.hostile("export kserve of a sim-engine spec, end to end")
def test_sim_engine_is_one_line(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text("engine: sim\nmodel: sim-vlm\n")
    done = export(vlmserve_cmd, "kserve", "-f", str(path), "--out", str(tmp_path / "x.yaml"))
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: kserve runs vLLM images; engine: sim") and done.stderr.count("\n") == 1
    assert not (tmp_path / "x.yaml").exists()
