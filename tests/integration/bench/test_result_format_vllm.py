"""`vlmserve bench --result-format vllm` against a sim engine, with vLLM's flag names: a vLLM result
file that `runs import` (a reader of vLLM files) takes back with the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_fixtures import bench_args
from tests.helpers.sim import SimHandle


def test_vllm_command_line_writes_a_vllm_result_file(sim: SimHandle, cli, tmp_path: Path) -> None:
    out = tmp_path / "vllm-result.json"
    done = cli(
        *bench_args(
            sim,
            "--dataset-name",
            "random",
            "--random-input-len",
            32,
            "--random-output-len",
            8,
            "--num-prompts",
            16,
            "--max-concurrency",
            4,
            "--result-format",
            "vllm",
            "--json-out",
            out,
        )
    )
    assert done.code == 0, done.err
    data = json.loads(out.read_text())
    assert data["completed"] == 16 and data["num_prompts"] == 16 and data["max_concurrency"] == 4
    assert data["request_rate"] == "inf" and data["model_id"] == "bench-sim" and data["total_output_tokens"] == 16 * 8
    assert len(data["ttfts"]) == len(data["itls"]) == 16 and all(len(gaps) == 7 for gaps in data["itls"])
    assert 15 < data["median_ttft_ms"] < 200 and "meta" not in data

    imported = cli("runs", "import", out)
    assert imported.code == 0, imported.err
    assert "(from vllm bench serve; model bench-sim; 16 request records)" in imported.out
    run_id = imported.out.split(" as run ")[1].split()[0]
    shown = json.loads(cli("runs", "show", run_id, "--json").out)
    assert shown["ttft_ms"]["p50"] == pytest.approx(data["median_ttft_ms"])
    assert shown["throughput"]["output_tokens_per_s"] == pytest.approx(data["output_throughput"])


def test_result_format_needs_json_out_and_a_known_name(sim: SimHandle, cli) -> None:
    done = cli(*bench_args(sim, "--concurrency", 1, "--num-requests", 1, "--result-format", "vllm"))
    assert done.code == 2 and "give --json-out FILE with it" in done.error_line
    done = cli(*bench_args(sim, "--concurrency", 1, "--num-requests", 1, "--json-out", "x.json", "--result-format", "guidellm"))
    assert done.code == 2 and "--result-format 'guidellm': use vlmserve or vllm" in done.error_line
