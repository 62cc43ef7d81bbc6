"""`vlmserve export k8s` lays the same recipe under the spec as `vlmserve up` does, with paths as
the pod sees the model."""

from __future__ import annotations

from pathlib import Path

from tests.unit.recipes.configs import GEMMA4_31B_IT, model_dir
from vlmserve.engines.launcher import make_launcher
from vlmserve.export.k8s import K8sOptions, render_manifests
from vlmserve.observe.alerts import AlertSettings
from vlmserve.spec import DeploymentSpec


def _container_args(spec: DeploymentSpec) -> list[str]:
    manifests = render_manifests(spec, K8sOptions(model_pvc="weights"), AlertSettings())
    return manifests["engine-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"]


def _without(argv: list[str], *flags: str) -> list[str]:
    out = list(argv)
    for flag in flags:
        del out[out.index(flag) : out.index(flag) + 2]
    return out


def test_export_and_up_apply_the_same_recipe(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "gemma-4-31b-it", GEMMA4_31B_IT)
    (directory / "tool_chat_template_gemma4.jinja").write_text("{{ messages }}")
    spec = DeploymentSpec(model=str(directory), devices="cpu")
    here = make_launcher(spec).arguments(host="0.0.0.0", port=8000, index=0)
    pod = _container_args(spec)
    assert here[here.index("--chat-template") + 1] == str(directory / "tool_chat_template_gemma4.jinja")
    assert pod[pod.index("--chat-template") + 1] == "/models/gemma-4-31b-it/tool_chat_template_gemma4.jinja"
    assert _without(here, "--model", "--port", "--chat-template") == _without(pod, "--model", "--port", "--chat-template")
    assert "--reasoning-parser" in pod and '{"max_soft_tokens":280}' in pod


def test_export_of_a_folder_it_cannot_read_gets_no_recipe(tmp_path: Path) -> None:
    weights = tmp_path / "qwen-vl"
    weights.mkdir()  # no config.json: the export never needed the weights, so no error either
    args = _container_args(DeploymentSpec(model=str(weights)))
    assert "--limit-mm-per-prompt" not in args and "--tool-call-parser" not in args


def test_export_without_recipe(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "g", GEMMA4_31B_IT)
    assert "--reasoning-parser" not in _container_args(DeploymentSpec(model=str(directory), recipe=False))
