"""engine_args takes any flag the installed vLLM takes, and refuses a misspelt one with a suggestion.

These read `vllm serve`'s own argument parser (importing vLLM: a few seconds, once per process).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vlmserve.engines.vllm import engine_arguments
from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec, describe_validation_error
from vlmserve.vllm_flags import engine_arg_argv, installed_vllm_flags

pytestmark = pytest.mark.skipif(installed_vllm_flags() is None, reason="vLLM is not installed")


def _spec(**engine_args: object) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"name": "t", "model": "embedded", "engine_args": engine_args})


def _error(**engine_args: object) -> str:
    with pytest.raises(ValidationError) as caught:
        _spec(**engine_args)
    return describe_validation_error(caught.value, "deploy.yaml")


def test_tool_and_reasoning_flags_reach_the_command_line() -> None:
    spec = _spec(tool_call_parser="hermes", reasoning_parser="deepseek_r1", enable_auto_tool_choice=True)
    argv = engine_arguments(spec, "/models/m", 8000, "cpu")
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert argv[argv.index("--reasoning-parser") + 1] == "deepseek_r1"
    assert "--enable-auto-tool-choice" in argv


def test_a_misspelt_flag_is_refused_with_a_suggestion() -> None:
    message = _error(tool_call_parsr="hermes")
    assert message == (
        "deploy.yaml: field 'engine_args.tool_call_parsr': not a flag of the installed vLLM; did you mean 'tool_call_parser'?"
    )
    assert "did you mean 'max_num_seqs'" in _error(max_num_seq=4)


def test_nonsense_gets_pointed_at_vllm_help() -> None:
    assert "see `vllm serve --help`" in _error(zzzz_qqqq=1)


def test_flags_vlmserve_sets_itself_are_refused() -> None:
    assert "set by vlmserve; use the spec's `port`" in _error(port=9000)


def test_values_render_as_vllm_reads_them() -> None:
    assert engine_arg_argv("enable_auto_tool_choice", False) == ["--no-enable-auto-tool-choice"]
    assert engine_arg_argv("limit_mm_per_prompt", {"image": 2}) == ["--limit-mm-per-prompt", '{"image":2}']
    assert engine_arg_argv("chat_template", "t.jinja") == ["--chat-template", "t.jinja"]


def test_the_spec_loader_turns_it_into_one_line(tmp_path) -> None:
    from vlmserve.spec import load_deployment_spec

    path = tmp_path / "deploy.yaml"
    path.write_text("name: t\nmodel: embedded\nengine_args:\n  reasoning_parsr: x\n")
    with pytest.raises(UserError) as caught:
        load_deployment_spec(path)
    assert "did you mean 'reasoning_parser'" in caught.value.message
