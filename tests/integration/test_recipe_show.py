"""`vlmserve recipe show` as a process, with the installed vLLM's real parser (building it starts a
subprocess, so these live here rather than in tests/unit): your flags are checked strictly, the
recipe's flags all exist in this vLLM. The misspelt flag goes through `main` in this process: a
second process would import vLLM again (about 9 s) to prove nothing the first did not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.unit.recipes.configs import GEMMA4_31B_IT, model_dir
from vlmserve.cli.app import main
from vlmserve.vllm_flags import vllm_package_dir


def _show(vlmserve_cmd: list[str], *args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [*vlmserve_cmd, "recipe", "show", *map(str, args)], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.skipif(vllm_package_dir() is None, reason="vLLM is not installed")
def test_gemma4_recipe_needs_nothing_dropped_and_user_flags_are_checked(
    vlmserve_cmd: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = model_dir(tmp_path, "gemma-4-31b-it", GEMMA4_31B_IT)
    done = _show(vlmserve_cmd, directory, "--flag", "tool_call_parser=hermes")
    assert done.returncode == 0, done.stderr
    assert "warning:" not in done.stderr
    command = next(line for line in done.stdout.splitlines() if line.startswith("vllm serve "))
    assert "--tool-call-parser hermes" in command and "--reasoning-parser gemma4" in command
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["recipe", "show", str(directory), "--flag", "reasoning_parsr=qwen3"])
    assert exited.value.code != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --flag: field 'reasoning_parsr': not a flag of the installed vLLM; did you mean 'reasoning_parser'?"
    )
