"""`vlmserve recipe show`: the resulting vLLM command line, each flag marked recipe or user; bad
input is one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.recipes.configs import GEMMA4_31B_IT, UNKNOWN, model_dir


def _row(out: str, flag: str) -> str:
    rows = [line for line in out.splitlines() if line.startswith("│ " + flag + " ")]
    assert rows, f"no table row for {flag} in:\n{out}"
    return rows[0]


def test_show_a_directory_holding_only_config_json(cli, tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "gemma-4-31b-it", GEMMA4_31B_IT)
    result = cli("recipe", "show", directory)
    assert result.code == 0, result.err
    assert "recipe: gemma4" in result.out
    for flag in ("--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice", "--mm-processor-kwargs"):
        assert " recipe " in _row(result.out, flag)
    command = next(line for line in result.out.splitlines() if line.startswith("vllm serve "))
    assert "--reasoning-parser gemma4" in command
    assert "--tool-call-parser gemma4" in command
    assert "--enable-auto-tool-choice" in command
    assert """--mm-processor-kwargs '{"max_soft_tokens":280}'""" in command
    assert "--limit-mm-per-prompt" in command


def test_user_flags_are_marked_user_and_win(cli, tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "g", GEMMA4_31B_IT)
    result = cli(
        "recipe",
        "show",
        directory,
        "--benchmark",
        "--flag",
        'mm_processor_kwargs={"max_soft_tokens":560}',
        "--flag",
        "no-async-scheduling",
    )
    assert result.code == 0, result.err
    assert " user " in _row(result.out, "--mm-processor-kwargs")
    assert " user " in _row(result.out, "--no-async-scheduling")
    assert " recipe " in _row(result.out, "--no-enable-prefix-caching")
    command = next(line for line in result.out.splitlines() if line.startswith("vllm serve "))
    assert 'max_soft_tokens":560' in command and 'max_soft_tokens":280' not in command
    assert " --async-scheduling" not in command


def test_unknown_family_says_so_and_shows_the_users_flags(cli, tmp_path: Path) -> None:
    result = cli("recipe", "show", model_dir(tmp_path, "fancy", UNKNOWN), "--flag", "max_num_seqs=8")
    assert result.code == 0, result.err
    assert "unknown family" in result.out and "only your flags are shown" in result.out
    assert " user " in _row(result.out, "--max-num-seqs")
    assert next(line for line in result.out.splitlines() if line.startswith("vllm serve ")).endswith("--max-num-seqs 8")


def test_a_missing_directory_is_one_line(cli, tmp_path: Path) -> None:
    result = cli("recipe", "show", tmp_path / "nope")
    assert result.code != 0
    assert result.error_line == f"error: {tmp_path / 'nope'}: no such directory; give a model directory or a hub id like org/name"
    assert "Traceback" not in result.err


def test_a_directory_without_config_json_is_one_line(cli, tmp_path: Path) -> None:
    result = cli("recipe", "show", tmp_path)
    assert result.error_line == f"error: {tmp_path}: no config.json here; give a Hugging Face model directory"


def test_a_broken_config_json_is_one_line(cli, tmp_path: Path) -> None:
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "config.json").write_text("{not json")
    result = cli("recipe", "show", directory)
    assert result.error_line.startswith(f"error: {directory / 'config.json'}: not valid JSON (")


def test_a_binary_config_json_is_one_line(cli, tmp_path: Path) -> None:
    directory = tmp_path / "binary"
    directory.mkdir()
    (directory / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    result = cli("recipe", "show", directory)
    assert result.error_line == f"error: {directory / 'config.json'}: not UTF-8 text; config.json is a JSON file"


def test_an_unreadable_config_json_is_one_line(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = model_dir(tmp_path, "locked", GEMMA4_31B_IT)
    config_file = directory / "config.json"
    config_file.chmod(0)
    if os.access(config_file, os.R_OK):  # root reads any file: refuse it the way the kernel would
        real_open = Path.open

        def refuse(self: Path, *args: object, **kwargs: object) -> object:
            if self == config_file:
                raise PermissionError(13, "Permission denied", str(self))
            return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "open", refuse)
    result = cli("recipe", "show", directory)
    assert result.error_line == (f"error: {config_file}: cannot read it (Permission denied); check the file's permissions")


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("=3", "error: --flag '=3': the name is not a flag name; write it like reasoning_parser=qwen3"),
        ("max num seqs=3", "error: --flag 'max num seqs=3': max num seqs is not a flag name;"),
        ("max_num_seqs=", "error: --flag 'max_num_seqs=': no value after '=';"),
        ("limit_mm_per_prompt={image", "error: --flag 'limit_mm_per_prompt={image': the value is not valid JSON;"),
        ("max_num_seqs=0", "error: --flag: field 'max_num_seqs': Input should be greater than or equal to 1"),
    ],
)
def test_bad_flag_syntax_is_one_line(cli, tmp_path: Path, flag: str, expected: str) -> None:
    result = cli("recipe", "show", model_dir(tmp_path, "g", GEMMA4_31B_IT), "--flag", flag)
    assert result.code != 0
    assert result.error_line.startswith(expected), result.error_line


def test_up_print_plan_applies_the_recipe_unless_told_not_to(cli, tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "gemma-4-31b-it", GEMMA4_31B_IT)
    base = ("up", "--model", directory, "--devices", "cpu", "--no-gateway", "--print-plan")
    result = cli(*base, "--benchmark-recipe")
    assert result.code == 0, result.err
    assert "recipe gemma4: --reasoning-parser gemma4" in result.out
    assert "--tool-call-parser gemma4" in result.out and "--no-enable-prefix-caching" in result.out
    plain = cli(*base, "--no-recipe")
    assert plain.code == 0, plain.err
    assert "--reasoning-parser" not in plain.out and "--limit-mm-per-prompt" not in plain.out
    both = cli(*base, "--no-recipe", "--benchmark-recipe")
    assert both.error_line == "error: --benchmark-recipe and --no-recipe contradict each other; give one"
