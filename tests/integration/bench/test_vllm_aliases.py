"""`vlmserve bench` runs `vllm bench serve` command lines: its flag names are aliases (bench/cli.py VLLM_ALIASES)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.sim import start_sim_engine
from vlmserve.cli.bench import goodput_to_slo
from vlmserve.errors import UserError


def test_the_vllm_acceptance_command_runs(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    with start_sim_engine(model="m", ttft_ms=5, itl_ms=1) as engine:
        done = subprocess.run(
            [
                *vlmserve_cmd,
                "bench",
                "--base-url",
                engine.base_url,
                "--model",
                "m",
                "--dataset-name",
                "random",
                "--random-input-len",
                "128",
                "--random-output-len",
                "64",
                "--num-prompts",
                "100",
                "--max-concurrency",
                "8",
                "--request-rate",
                "inf",
                "--goodput",
                "ttft:500 tpot:50",
                "--endpoint",
                "/v1/completions",
                "--seed",
                "1",
                "--json-out",
                str(tmp_path / "run.json"),
                "--no-store",
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["requests"]["completed"] == 100
    assert "tpot_p99" in done.stdout  # --goodput became the run's SLO


def test_goodput_is_per_request_milliseconds() -> None:
    assert goodput_to_slo(["ttft:500 tpot:50", "e2el:2000"]) == "ttft_p99=500ms,tpot_p99=50ms,e2e_p99=2000ms"


@pytest.mark.parametrize(
    "pairs, message",
    [
        (["itl:5"], "--goodput 'itl:5': write KEY:MILLISECONDS with KEY one of ttft, tpot, e2el, e.g. ttft:500"),
        (["ttft:fast"], "--goodput 'ttft:fast': fast is not a number of milliseconds"),
    ],
)
def test_goodput_errors_name_the_pair(pairs: list[str], message: str) -> None:
    with pytest.raises(UserError) as caught:
        goodput_to_slo(pairs)
    assert caught.value.message == message


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--request-rate", "inf", "--num-prompts", "4"],
            "--request-rate inf sends everything at once; give --max-concurrency N",
        ),
        (["--request-rate", "5", "--max-concurrency", "4", "--num-prompts", "4"], "capped open loop) is not run here"),
        (
            ["--goodput", "ttft:5", "--slo", "ttft_p95=5ms", "--max-concurrency", "1", "--num-prompts", "4"],
            "--goodput and --slo contradict",
        ),
        (
            ["--endpoint", "/v1/embeddings", "--max-concurrency", "1", "--num-prompts", "4"],
            "--endpoint '/v1/embeddings': use /v1/chat/completions or /v1/completions",
        ),
    ],
)
def test_vllm_flags_that_do_not_fit_are_one_line(vlmserve_cmd: list[str], flags: list[str], message: str) -> None:
    done = subprocess.run(
        [*vlmserve_cmd, "bench", "--base-url", "http://127.0.0.1:9", "--model", "m", *flags, "--no-store", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
