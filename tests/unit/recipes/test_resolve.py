"""Recipes are chosen from config.json and laid under the user's flags: the user wins, and a flag
the installed vLLM lacks is dropped with one warning line (never a failed start)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.recipes.configs import GEMMA4_31B_IT, GEMMA4_E4B, IDEFICS3, QWEN3_VL, UNKNOWN, model_dir
from vlmserve.recipes import resolve as resolve_module
from vlmserve.recipes.apply import choose_recipe, resolve_for, spec_with_recipe
from vlmserve.spec import DeploymentSpec, EngineArgs


def _everything_known(key: str, value: Any) -> str | None:
    return None


def _flags(
    tmp_path: Path, name: str, config: dict[str, Any], *, benchmark: bool = False, args: EngineArgs | None = None
) -> dict[str, Any]:
    chosen = choose_recipe(str(model_dir(tmp_path, name, config)))
    resolution = resolve_for(chosen, args or EngineArgs(), benchmark=benchmark, check=_everything_known)
    assert not resolution.warnings
    return {flag.key: flag.value for flag in resolution.flags}


def test_gemma4_31b_it_is_image_only(tmp_path: Path) -> None:
    flags = _flags(tmp_path, "gemma-4-31b-it", GEMMA4_31B_IT)
    assert flags["reasoning_parser"] == "gemma4"
    assert flags["tool_call_parser"] == "gemma4"
    assert flags["enable_auto_tool_choice"] is True
    assert flags["async_scheduling"] is True
    assert flags["limit_mm_per_prompt"] == {"image": 4, "audio": 0}
    assert flags["mm_processor_kwargs"] == {"max_soft_tokens": 280}
    assert "enable_prefix_caching" not in flags


def test_gemma4_e4b_with_audio_config_allows_audio(tmp_path: Path) -> None:
    assert _flags(tmp_path, "gemma-4-e4b-it", GEMMA4_E4B)["limit_mm_per_prompt"] == {"image": 4, "audio": 1}


def test_benchmark_turns_prefix_caching_off(tmp_path: Path) -> None:
    assert _flags(tmp_path, "g", GEMMA4_31B_IT, benchmark=True)["enable_prefix_caching"] is False


def test_qwen3_vl_instruct_and_thinking(tmp_path: Path) -> None:
    instruct = _flags(tmp_path, "Qwen3-VL-8B-Instruct", QWEN3_VL)
    assert instruct["tool_call_parser"] == "hermes" and instruct["enable_auto_tool_choice"] is True
    assert "reasoning_parser" not in instruct
    assert instruct["limit_mm_per_prompt"] == {"image": 4, "video": 0}
    assert instruct["mm_processor_kwargs"] == {"max_pixels": 1280 * 32 * 32}
    assert _flags(tmp_path, "Qwen3-VL-8B-Thinking", QWEN3_VL)["reasoning_parser"] == "qwen3"


def test_idefics3_has_limits_and_no_tool_parser(tmp_path: Path) -> None:
    assert _flags(tmp_path, "smolvlm", IDEFICS3) == {"limit_mm_per_prompt": {"image": 4}}


def test_an_architecture_alone_finds_the_family(tmp_path: Path) -> None:
    config = {**IDEFICS3, "model_type": "my_finetune"}
    assert choose_recipe(str(model_dir(tmp_path, "ft", config))).recipe is not None


def test_unknown_family_keeps_the_users_flags_only(tmp_path: Path) -> None:
    chosen = choose_recipe(str(model_dir(tmp_path, "fancy", UNKNOWN)))
    assert chosen.recipe is None and "unknown family" in chosen.basis and "'fancy_vlm'" in chosen.basis
    resolution = resolve_for(chosen, EngineArgs(max_num_seqs=8), benchmark=False, check=_everything_known)
    assert [(flag.key, flag.origin) for flag in resolution.flags] == [("max_num_seqs", "user")]


def test_a_user_flag_replaces_the_recipe_flag(tmp_path: Path) -> None:
    chosen = choose_recipe(str(model_dir(tmp_path, "g", GEMMA4_31B_IT)))
    args = EngineArgs(limit_mm_per_prompt={"image": 1}, extra_args=["--no-async-scheduling"])
    resolution = resolve_for(chosen, args, benchmark=False, check=_everything_known)
    by_key = {flag.key: flag for flag in resolution.flags}
    assert by_key["limit_mm_per_prompt"].origin == "user"
    assert by_key["limit_mm_per_prompt"].value == {"image": 1}
    assert "replaces the recipe's --limit-mm-per-prompt" in by_key["limit_mm_per_prompt"].why
    assert by_key["async_scheduling"].origin == "user"
    assert resolution.argv().count("--limit-mm-per-prompt") == 1
    assert "--async-scheduling" not in resolution.argv()
    assert resolution.engine_args.limit_mm_per_prompt == {"image": 1}
    assert resolution.engine_args.async_scheduling is None  # the user's extra_args switch stands alone


FAKE_FLAGS = {
    "reasoning_parser",
    "tool_call_parser",
    "enable_auto_tool_choice",
    "limit_mm_per_prompt",
    "mm_processor_kwargs",
}  # an older vLLM: no --async-scheduling
FAKE_PARSERS = {"reasoning_parser": {"qwen3"}, "tool_call_parser": {"hermes"}}  # and no gemma4 parsers


def test_flags_the_installed_vllm_lacks_are_dropped_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve_module, "vllm_has_flag", lambda key: key in FAKE_FLAGS)
    monkeypatch.setattr(resolve_module, "vllm_has_parser", lambda key, name: name in FAKE_PARSERS[key])
    monkeypatch.setattr(resolve_module, "vllm_version", lambda: "0.9.0")
    resolution = resolve_for(choose_recipe(str(model_dir(tmp_path, "g", GEMMA4_31B_IT))), EngineArgs(), benchmark=False)
    assert list(resolution.warnings) == [
        "recipe flag --reasoning-parser gemma4 dropped: the installed vLLM 0.9.0 has no reasoning parser named 'gemma4'",
        "recipe flag --tool-call-parser gemma4 dropped: the installed vLLM 0.9.0 has no tool call parser named 'gemma4'",
        "recipe flag --async-scheduling dropped: the installed vLLM 0.9.0 has no such flag",
        "recipe flag --enable-auto-tool-choice dropped: vLLM refuses it without --tool-call-parser",
    ]
    assert {flag.key for flag in resolution.flags} == {"limit_mm_per_prompt", "mm_processor_kwargs"}


def test_without_vllm_flags_pass_unchecked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve_module, "vllm_has_flag", lambda key: None)
    monkeypatch.setattr(resolve_module, "vllm_has_parser", lambda key, name: None)
    resolution = resolve_for(choose_recipe(str(model_dir(tmp_path, "g", GEMMA4_31B_IT))), EngineArgs(), benchmark=False)
    assert not resolution.warnings and len(resolution.recipe_flags()) == 6


def test_the_installed_vllm_has_what_the_recipes_name() -> None:
    from vlmserve.vllm_flags import vllm_package_dir

    if vllm_package_dir() is None:
        pytest.skip("vLLM is not installed")
    for key, value in [
        ("reasoning_parser", "gemma4"),
        ("tool_call_parser", "gemma4"),
        ("reasoning_parser", "qwen3"),
        ("tool_call_parser", "hermes"),
        ("enable_auto_tool_choice", True),
        ("async_scheduling", True),
        ("limit_mm_per_prompt", {}),
        ("mm_processor_kwargs", {}),
    ]:
        assert resolve_module.installed_vllm_check(key, value) is None, key
    assert "no such flag" in (resolve_module.installed_vllm_check("surely_not_a_flag", 1) or "")


def test_a_spec_gets_its_recipe_unless_told_not_to(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "g", GEMMA4_31B_IT)
    spec = DeploymentSpec(model=str(directory), engine_args=EngineArgs(max_num_seqs=4))
    events: list[str] = []
    applied = spec_with_recipe(spec, str(directory), events.append)
    assert applied.engine_args.limit_mm_per_prompt == {"image": 4, "audio": 0}
    assert applied.engine_args.async_scheduling is True and applied.engine_args.max_num_seqs == 4
    assert "--reasoning-parser" in applied.engine_args.extra_args
    assert any(line.startswith("recipe gemma4:") for line in events)
    off = spec.model_copy(update={"recipe": False})
    assert spec_with_recipe(off, str(directory)) is off
    bench = spec_with_recipe(spec.model_copy(update={"recipe": "benchmark"}), str(directory))
    assert bench.engine_args.enable_prefix_caching is False


def test_the_embedded_model_keeps_starting_as_before(tmp_path: Path) -> None:
    from vlmserve.engines.vllm import engine_arguments

    spec = DeploymentSpec(engine_args=EngineArgs(max_model_len=2048))
    applied = spec_with_recipe(spec, str(tmp_path))  # the embedded recipe reads no config.json
    argv = engine_arguments(applied, str(tmp_path), 8001, "cpu")
    assert argv[argv.index("--limit-mm-per-prompt") + 1] == '{"image":16}'
    assert "--enforce-eager" in argv and "--reasoning-parser" not in argv
    # the OpenAI SDK's tool examples (tool_choice auto) work on the default model
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in argv


def test_the_spec_field_reads_from_yaml_values() -> None:
    assert DeploymentSpec.model_validate({"recipe": False}).recipe is False
    assert DeploymentSpec.model_validate({"recipe": "benchmark"}).recipe == "benchmark"
    assert DeploymentSpec().recipe is True


def test_an_engine_args_key_replaces_the_recipes_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmserve import vllm_flags

    # a fake flag table: building vLLM's real parser starts a subprocess, which the unit tier forbids
    fake = {"tool_call_parser": vllm_flags.VllmFlag("--tool-call-parser", boolean=False, multiple=False)}
    monkeypatch.setattr(vllm_flags, "installed_vllm_flags", lambda: fake)
    chosen = choose_recipe(str(model_dir(tmp_path, "g", GEMMA4_31B_IT)))
    args = EngineArgs.model_validate({"tool_call_parser": "hermes"})
    resolution = resolve_for(chosen, args, benchmark=False, check=_everything_known)
    argv = resolution.argv()
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and argv.count("--tool-call-parser") == 1
    assert "--enable-auto-tool-choice" in argv  # the recipe's switch stays: the user's parser serves it
    assert "--tool-call-parser" not in resolution.engine_args.extra_args  # the user's key renders itself


def test_dotted_and_equals_extra_args_count_as_the_users(tmp_path: Path) -> None:
    chosen = choose_recipe(str(model_dir(tmp_path, "q", QWEN3_VL)))
    args = EngineArgs(extra_args=["--limit-mm-per-prompt.image", "2", "--tool-call-parser=qwen3_xml"])
    resolution = resolve_for(chosen, args, benchmark=False, check=_everything_known)
    assert [flag.key for flag in resolution.recipe_flags()] == ["enable_auto_tool_choice", "mm_processor_kwargs"]


def test_a_hub_id_without_a_cached_config_has_no_recipe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing is fetched
    chosen = choose_recipe("someorg/some-vlm")
    assert chosen.recipe is None
    assert "not in the Hugging Face cache (HF_HUB_OFFLINE is set;" in chosen.basis
    assert "hf download someorg/some-vlm config.json" in chosen.basis


def test_a_tool_chat_template_in_the_model_directory_is_passed(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "g", GEMMA4_31B_IT)
    (directory / "tool_chat_template_gemma4.jinja").write_text("{{ messages }}")
    flags = _flags(tmp_path, "g", GEMMA4_31B_IT)
    assert flags["chat_template"] == str(directory / "tool_chat_template_gemma4.jinja")
