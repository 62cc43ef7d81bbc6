"""LoRA adapters in the deployment spec: the fields, vLLM's flags for them, and every bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from vlmserve.engines import embedded_adapters
from vlmserve.engines.lora import lora_argv, resolved_adapters
from vlmserve.engines.vllm import engine_arguments
from vlmserve.errors import UserError
from vlmserve.spec import MAX_SPEC_ADAPTERS, DeploymentSpec, describe_validation_error


def spec(**fields: Any) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"model": "org/vlm", "port": 9000, **fields})


def refusal(**fields: Any) -> str:
    """The one line a bad spec gets (what `up -f` prints after 'error: ')."""
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    return describe_validation_error(caught.value, "spec.yaml")


def write_adapter(folder: Path, rank: int = 8, **config: Any) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 16, **config}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


def test_lora_fields_become_vllms_flags_under_vllms_names(tmp_path: Path) -> None:
    clinic = write_adapter(tmp_path / "clinic")
    deployment = spec(
        lora_modules={"clinic-a": str(clinic), "tutor": str(clinic)}, max_loras=2, max_lora_rank=16, max_cpu_loras=4
    )
    argv = engine_arguments(deployment, "/m", 9001, "cpu")
    start = argv.index("--enable-lora")
    assert argv[start : start + 10] == [
        "--enable-lora",
        "--lora-modules",
        f"clinic-a={clinic}",
        f"tutor={clinic}",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "16",
        "--max-cpu-loras",
        "4",
    ]
    assert "--enable-lora" not in engine_arguments(spec(), "/m", 9001, "cpu")  # off unless asked for
    assert lora_argv(spec(max_loras=3)) == ["--enable-lora", "--max-loras", "3"]  # slots for adapters loaded later


def test_embedded_adapters_resolve_to_made_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLMSERVE_CACHE", str(tmp_path / "cache"))
    resolved = resolved_adapters(spec(lora_modules={"a": "embedded:0", "b": "embedded:1"}))
    assert resolved == {"a": str(embedded_adapters.adapter_path(0)), "b": str(embedded_adapters.adapter_path(1))}
    config = json.loads((Path(resolved["a"]) / "adapter_config.json").read_text())
    assert config["r"] == embedded_adapters.ADAPTER_RANK and config["peft_type"] == "LORA"
    first = (Path(resolved["a"]) / "adapter_model.safetensors").read_bytes()
    again = embedded_adapters.make_adapter(0, tmp_path / "again")
    assert (again / "adapter_model.safetensors").read_bytes() == first  # deterministic: same seed, same bytes
    assert (Path(resolved["b"]) / "adapter_model.safetensors").read_bytes() != first  # each adapter its own


def test_embedded_adapter_weights_are_large_against_the_base() -> None:
    """The update B·A·alpha/r must be as large as the base's weights (std 0.02) so that answers change."""
    tensors = embedded_adapters.adapter_tensors(3)
    stem = "base_model.model.model.text_model.layers.0.self_attn.q_proj"
    a, b = tensors[f"{stem}.lora_A.weight"].float(), tensors[f"{stem}.lora_B.weight"].float()  # type: ignore[attr-defined]
    delta = b @ a * (embedded_adapters.ADAPTER_ALPHA / embedded_adapters.ADAPTER_RANK)
    assert delta.std().item() > 0.04
    assert not any("vision" in name for name in tensors)  # the language model only


@pytest.mark.hostile("up -f SPEC: lora_modules with a name that is no model name (spaces, slash, 70 chars): one line")
@pytest.mark.parametrize("name", ["my adapter", "../x", "a" * 70, "-lead"])
def test_bad_adapter_names_are_one_line(name: str) -> None:
    line = refusal(lora_modules={name: "/x"})
    assert line.startswith("spec.yaml: field 'lora_modules': adapter name") and "is not allowed" in line


@pytest.mark.hostile("up -f SPEC: lora bounds: rank vLLM does not take, cpu slots below gpu slots, base name reused")
def test_lora_bounds_are_one_line_each() -> None:
    assert "17 is not a rank vLLM takes; use one of 1, 8, 16" in refusal(max_lora_rank=17)
    assert "max_cpu_loras 1 is below max_loras 2" in refusal(max_loras=2, max_cpu_loras=1)
    assert "is the base model's served name" in refusal(
        lora_modules={"vision": "/x"}, engine_args={"served_model_name": "vision"}
    )
    assert f"at most {MAX_SPEC_ADAPTERS}" in refusal(lora_modules={f"a{i}": "/x" for i in range(MAX_SPEC_ADAPTERS + 1)})
    assert "has no path" in refusal(lora_modules={"a": " "})
    assert "field 'engine_args.max_loras': set by vlmserve; use the spec's `max_loras`" in refusal(engine_args={"max_loras": 4})


@pytest.mark.hostile("up -f SPEC: a lora_modules path that is missing, a file, not PEFT, unreadable JSON, too high a rank")
def test_bad_adapter_directories_are_one_line_each(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "adapter_config.json").write_text("{}")
    broken = write_adapter(tmp_path / "broken")
    (broken / "adapter_config.json").write_text("{not json")
    cases = {
        str(tmp_path / "missing"): "does not exist; give the adapter's PEFT directory",
        str(tmp_path / "file"): "is not a directory",
        str(tmp_path / "empty"): "has no adapter_config.json; is it a PEFT LoRA adapter?",
        str(no_weights): "has no adapter_model.safetensors or adapter_model.bin",
        str(broken): "adapter_config.json is not valid JSON",
        str(write_adapter(tmp_path / "ia3", peft_type="IA3")): "a IA3 adapter; vLLM serves LoRA adapters only",
        str(write_adapter(tmp_path / "no-rank", rank=0)): "no positive integer 'r'",
        str(write_adapter(tmp_path / "big", rank=32)): "rank 32 is above max_lora_rank (vLLM's default is 16); "
        "set max_lora_rank to at least 32",
        "embedded:99": "embedded adapter 99 does not exist; use 0..63",
        "embedded:one": "write an embedded adapter as embedded:N",
    }
    for path, expected in cases.items():
        with pytest.raises(UserError) as caught:
            resolved_adapters(spec(lora_modules={"clinic": path}))
        assert expected in caught.value.message, (path, caught.value.message)
        assert caught.value.message.startswith(("lora_modules.clinic: ", "embedded adapter", "'embedded:")), caught.value.message
        assert "\n" not in caught.value.message
    with pytest.raises(UserError) as caught:
        resolved_adapters(spec(lora_modules={"clinic": str(tmp_path / "big")}, max_lora_rank=16))
    assert "rank 32 is above max_lora_rank; set max_lora_rank to at least 32" in caught.value.message


@pytest.mark.hostile("up -f SPEC --print-plan: an adapter directory that does not exist: one 'error:' line, exit non-zero")
def test_up_refuses_a_missing_adapter_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.cli import run_cli

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"model: org/vlm\nrecipe: false\nlora_modules:\n  clinic: {tmp_path / 'gone'}\n")
    code, out, err = run_cli(["up", "-f", str(spec_file), "--print-plan"], capsys)
    assert code != 0 and out == ""
    assert err.strip() == f"error: lora_modules.clinic: {tmp_path / 'gone'} does not exist; give the adapter's PEFT directory"
    write_adapter(tmp_path / "gone")
    code, out, err = run_cli(["up", "-f", str(spec_file), "--print-plan"], capsys)
    assert code == 0 and f"--enable-lora --lora-modules clinic={tmp_path / 'gone'}" in out.replace("\n", "")


def test_runtime_adapter_loading_is_on_behind_a_gateway_only() -> None:
    from vlmserve.engines.vllm import RUNTIME_LORA_ENV, plan_launches

    behind = plan_launches(spec(max_loras=2, replicas=2, gateway=True), "/m", "cpu")
    assert all(launch.env[RUNTIME_LORA_ENV] == "1" for launch in behind)
    exposed = plan_launches(spec(max_loras=2, gateway=False), "/m", "cpu")  # replicas reachable directly: never
    assert RUNTIME_LORA_ENV not in exposed[0].env
    assert RUNTIME_LORA_ENV not in plan_launches(spec(replicas=2), "/m", "cpu")[0].env  # no LoRA: never


def test_sim_replicas_get_the_specs_adapters_and_slots() -> None:
    from vlmserve.engines.launcher import make_launcher

    deployment = DeploymentSpec.model_validate(
        {"engine": "sim", "model": "m", "sim": {"profile": "tiny-cpu"}, "lora_modules": {"a": "sim", "b": "sim"}, "max_loras": 1}
    )
    launcher = make_launcher(deployment)
    argv = launcher.arguments(host="127.0.0.1", port=9001, index=0)
    joined = " ".join(argv)
    assert "--lora-module a --lora-module b --max-loras 1" in joined and "--max-cpu-loras" not in joined
    assert launcher.expected().adapters == ("a", "b")  # readiness checks each, as on vLLM
