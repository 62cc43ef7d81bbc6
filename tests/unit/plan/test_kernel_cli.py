"""`vlmserve plan --cost-model/--vllm-version/--explain`: the source of every op's cost on the command line."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_cli

PLAN = ["plan", "--model", "llama-3.1-8b", "--concurrency", "2", "--num-requests", "4", "--output-len", "8"]


def test_explain_names_the_table_gpu_and_vllm_version_of_each_op(capsys) -> None:
    code, out, _ = run_cli([*PLAN, "--gpu", "h100", "--tp", "2", "--explain"], capsys)
    assert code == 0
    assert "step costs: measured vLLM kernels" in out
    assert "gemm/gemm_perf.parquet (h100_sxm, vLLM 0.24.0), bfloat16" in out
    assert "attention/generation_attention_perf.parquet (h100_sxm, vLLM 0.24.0), 16/4 heads × 128" in out
    assert "comm/custom_allreduce_perf.parquet (h100_sxm, vLLM 0.24.0), 2 GPUs" in out


def test_explain_on_a_gpu_without_tables_says_roofline(capsys) -> None:
    code, out, _ = run_cli([*PLAN, "--model", "qwen3-4b", "--gpu", "l4", "--explain"], capsys)
    assert code == 0
    assert "roofline: the measured kernel tables do not cover L4" in out


def test_older_vllm_version_picks_older_tables(capsys) -> None:
    code, out, _ = run_cli([*PLAN, "--gpu", "h100", "--tp", "2", "--vllm-version", "0.15.0", "--explain"], capsys)
    assert code == 0
    assert "comm/custom_allreduce_perf.parquet (h100_sxm, vLLM 0.14.0)" in out


@pytest.mark.hostile("plan --cost-model/--vllm-version with bad values: one line, exit 2")
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cost-model", "magic"], "error: --cost-model 'magic' is not known; use one of: auto, kernels, roofline"),
        (["--gpu", "l4", "--cost-model", "kernels"], "error: --cost-model kernels: the measured kernel tables do not cover L4"),
        (["--vllm-version", "../../etc/passwd"], "error: --vllm-version '../../etc/passwd' is not a version like 0.11.0"),
    ],
)
def test_bad_cost_model_options_are_one_line_and_exit_2(extra: list[str], message: str, capsys) -> None:
    code, _out, err = run_cli([*PLAN, *extra], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_plan_prints_the_kv_lines_vllm_would_print_and_takes_ep(capsys) -> None:
    from vlmserve.hardware.setup import PlanSetup

    code, out, _ = run_cli([*PLAN, "--gpu", "h100", "--max-model-len", "4096"], capsys)
    assert code == 0
    report = PlanSetup.from_names("llama-3.1-8b", "h100", max_model_len=4096).vllm_startup_report(4096)
    assert f"GPU KV cache size: {report.kv_cache_tokens:,} tokens" in out
    assert f"Maximum concurrency for 4,096 tokens per request: {report.max_concurrency:.2f}x" in out
    code, _, err = run_cli([*PLAN, "--gpu", "h100", "--ep", "2"], capsys)
    assert code != 0 and "--ep applies to MoE models" in err
