"""`vlmserve vllm-bench`: what it refuses before vLLM starts (each a one-line error, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.bench_fixtures import CliResult


def _refused(result: CliResult, words: str) -> None:
    assert result.code == 2 and "Traceback" not in result.err
    assert result.error_line.startswith("error:") and words in result.error_line, result.err


@pytest.mark.hostile("vllm-bench with no deployment and no endpoint")
def test_no_deployment_names_how_to_give_one(cli) -> None:
    _refused(cli("vllm-bench", "--deployment", "nowhere"), "no deployment named 'nowhere'")


@pytest.mark.hostile("vllm-bench --base-url without a local tokenizer (vLLM would fetch one from a hub)")
def test_an_endpoint_needs_a_local_tokenizer(cli) -> None:
    _refused(cli("vllm-bench", "--base-url", "http://127.0.0.1:9", "--model", "m"), "--base-url needs --model and --tokenizer")


@pytest.mark.hostile("vllm-bench passes --model to vLLM behind the verb's back")
def test_filled_flags_belong_before_the_separator(cli, tmp_path: Path) -> None:
    result = cli("vllm-bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", tmp_path, "--", "--model=other")
    _refused(result, "give --model to vlmserve vllm-bench itself")


@pytest.mark.hostile("vllm-bench --result-dir would leave the verb without the result it stores")
def test_result_paths_are_the_verbs_own(cli, tmp_path: Path) -> None:
    result = cli(
        "vllm-bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", tmp_path, "--", "--result-dir", tmp_path
    )
    _refused(result, "--result-dir: vlmserve keeps the result itself")
