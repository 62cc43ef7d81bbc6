"""`vlmserve plan` from the command line: output, JSON, errors (one line, exit 2), calibrate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli


def test_plan_as_the_issue_writes_it(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "plan.json"
    code, out, _ = run_cli(
        [
            "plan",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "H100",
            "--tp",
            "1",
            "--replicas",
            "2",
            "--input-len",
            "512",
            "--output-len",
            "32",
            "--concurrency",
            "8",
            "--num-requests",
            "40",
            "--json-out",
            str(out_file),
            "--explain",
        ],
        capsys,
    )
    assert code == 0
    assert "planner output (simulated" in out
    assert "bandwidth-bound tok/s" in out
    summary = json.loads(out_file.read_text())
    assert summary["meta"]["simulated"] is True
    assert summary["requests"]["completed"] == 40
    assert summary["meta"]["deployment"]["replicas"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "--model", "llama-3.1-8b", "--gpu", "v100", "--concurrency", "1"],
            "error: unknown GPU 'v100'; known GPUs: a100,",
        ),
        (["plan", "--model", "llama-3.1-70b", "--gpu", "l40s", "--concurrency", "1"], "GiB missing in all"),
        (["plan", "--model", "nope", "--concurrency", "1"], "error: unknown model 'nope'"),
        (["plan", "--model", "llama-3.1-8b"], "error: give --concurrency N (closed loop) or --rate R"),
        (
            ["plan", "--model", "llama-3.1-8b", "--concurrency", "1", "--weight-dtype", "int3"],
            "error: --weight-dtype 'int3' is not known",
        ),
        (
            ["plan", "--model", "llama-3.1-8b", "--concurrency", "1", "--routing", "random"],
            "error: --routing 'random' is not known",
        ),
        (
            ["plan", "search", "--model", "llama-3.1-8b", "--slo", "ttft_p95=1s", "--rate", "1", "--price", "h100=3"],
            "error: --price has no price for h200, l40s",
        ),
        (
            ["plan", "search", "--model", "llama-3.1-8b", "--slo", "speed=1", "--rate", "1"],
            "error: --slo: unknown objective 'speed'",
        ),
        (
            ["plan", "search", "--model", "qwen3-vl-4b", "--slo", "ttft_p95=1s", "--rate", "1", "--api-server-counts", "1,0"],
            "error: --api-server-counts: values must be at least 1",
        ),
        (
            ["plan", "search", "--model", "qwen3-vl-4b", "--slo", "ttft_p95=1s", "--rate", "1", "--api-server-counts", "2,5000"],
            "error: --api-server-counts must be at most 1024, got 5000",
        ),
        (
            [
                "plan",
                "search",
                "--model",
                "qwen3-vl-4b",
                "--slo",
                "ttft_p95=1s",
                "--rate",
                "1",
                "--mm-preprocess-ms-per-image",
                "nan",
            ],
            "error: --mm-preprocess-ms-per-image must be a finite number of milliseconds, got nan",
        ),
        (
            ["plan", "--model", "qwen3-vl-4b", "--rate", "1", "--dataset", "images", "--api-server-count", "0"],
            "error: --api-server-count must be at least 1, got 0",
        ),
        (
            ["plan", "--model", "qwen3-vl-4b", "--rate", "1", "--dataset", "images", "--mm-preprocess-ms-per-image", "inf"],
            "error: --mm-preprocess-ms-per-image must be a finite number of milliseconds, got inf",
        ),
        (
            ["plan", "--model", "qwen3-vl-4b", "--rate", "1", "--dataset", "images", "--mm-preprocess-ms-per-megapixel", "-2"],
            "error: --mm-preprocess-ms-per-image and --mm-preprocess-ms-per-megapixel must not be negative",
        ),
        (
            ["plan", "--model", "qwen3-vl-4b", "--concurrency", "1", "--max-num-encoder-input-tokens", "0"],
            "--max-num-encoder-input-tokens must be at least 1 (leave it out for --max-num-batched-tokens), got 0",
        ),
        (
            ["plan", "--model", "qwen3-vl-4b", "--concurrency", "1", "--encoder-cache-size", "-1"],
            "--encoder-cache-size must be at least 1 (leave it out for --max-num-batched-tokens), got -1",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    code, _out, err = run_cli(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_config_json_missing_a_field(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1000}))
    code, _out, err = run_cli(["plan", "--model", str(config), "--concurrency", "1"], capsys)
    assert code == 2
    assert "config.json has no 'intermediate_size' field (needed for MLP weights)" in err


def test_search_prints_winner_and_runners_up(capsys) -> None:
    code, out, _ = run_cli(
        [
            "plan",
            "search",
            "--model",
            "llama-3.1-8b",
            "--slo",
            "ttft_p95=800ms,tpot_p95=60ms",
            "--gpus",
            "h100,l4",
            "--price",
            "h100=3.0,l4=0.6",
            "--rate",
            "4",
            "--input-len",
            "256",
            "--output-len",
            "32",
            "--num-requests",
            "40",
            "--tps",
            "1",
            "--replicas",
            "1,2",
            "--max-num-seqs",
            "64",
        ],
        capsys,
    )
    assert code == 0
    assert "best" in out and "meets the SLO" in out
    assert "configurations (" in out


def test_calibrate_recovers_the_bandwidth_of_a_measured_run(tmp_path: Path, capsys) -> None:
    """A run 'measured' on a GPU at 50% bandwidth: the fit finds it from a 70% start."""
    from vlmserve.hardware.calibration import Calibration, Efficiency
    from vlmserve.hardware.setup import PlanSetup
    from vlmserve.plan.simulate import simulate_run
    from vlmserve.spec import LoadSpec

    truth = Calibration(Efficiency(bandwidth=0.5, compute=0.4, step_overhead_s=0.002))
    setup = PlanSetup.from_names("llama-3.1-8b", "h100", calibration=truth)
    result = simulate_run(setup, LoadSpec(input_len=256, output_len=64, concurrency=4, num_requests=24)).result
    result.summary.meta.simulated = False  # stands in for a bench run on a real H100
    result.summary.meta.deployment = {"model": "llama-3.1-8b", "replicas": 1, "engine_args": {"tensor_parallel_size": 1}}
    run_file = tmp_path / "run.json"
    result.write_json(run_file)
    start = tmp_path / "start.json"
    Calibration(Efficiency(bandwidth=0.7, compute=0.4, step_overhead_s=0.002)).save(start)
    saved = tmp_path / "cal.json"
    code, out, _ = run_cli(
        [
            "plan",
            "calibrate",
            str(run_file),
            "--gpu",
            "h100",
            "--calibration",
            str(start),
            "--fit",
            "bandwidth",
            "-o",
            str(saved),
        ],
        capsys,
    )
    assert code == 0
    assert "median abs error" in out
    fitted = Calibration.load(saved)
    assert fitted.for_gpu("h100").bandwidth == pytest.approx(0.5, rel=0.1)
    assert max(fitted.fit_error.values()) < 0.05


def test_calibrate_rejects_bad_runs(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"throughput": {}}))
    code, _out, err = run_cli(["plan", "calibrate", str(bad), "--gpu", "h100"], capsys)
    assert code == 2 and "no meta.load_spec in it" in err
    code, _out, err = run_cli(["plan", "calibrate", str(tmp_path / "none.json"), "--gpu", "h100"], capsys)
    assert code == 2 and "no such run file" in err


@pytest.mark.hostile("plan calibrate on a run whose meta.deployment gives a count that is not a number")
def test_calibrate_names_a_deployment_count_that_is_not_a_number(tmp_path: Path, capsys) -> None:
    from vlmserve.hardware.setup import PlanSetup
    from vlmserve.plan.simulate import simulate_run
    from vlmserve.spec import LoadSpec

    setup = PlanSetup.from_names("llama-3.1-8b", "h100")
    result = simulate_run(setup, LoadSpec(input_len=64, output_len=8, concurrency=1, num_requests=2)).result
    result.summary.meta.simulated = False
    result.summary.meta.deployment = {"model": "llama-3.1-8b", "engine_args": {"tensor_parallel_size": "two"}}
    run_file = tmp_path / "run.json"
    result.write_json(run_file)
    code, _out, err = run_cli(["plan", "calibrate", str(run_file), "--gpu", "h100"], capsys)
    assert code == 2
    assert "meta.deployment.engine_args.tensor_parallel_size is 'two', not a whole number" in err
    assert "Traceback" not in err


def test_real_subprocess_exit_code(vlmserve_cmd: list[str]) -> None:
    done = subprocess.run(
        [*vlmserve_cmd, "plan", "--model", "llama-3.1-8b", "--gpu", "tpu9", "--concurrency", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: unknown GPU 'tpu9'")


def test_compare_with_a_measured_run_shows_errors_and_efficiency(tmp_path: Path, capsys) -> None:
    measured = tmp_path / "measured.json"
    code, _out, _err = run_cli(
        [
            "plan",
            "--model",
            "llama-3.1-8b",
            "--concurrency",
            "4",
            "--num-requests",
            "12",
            "--input-len",
            "256",
            "--output-len",
            "16",
            "--json-out",
            str(measured),
        ],
        capsys,
    )
    assert code == 0
    code, out, _err = run_cli(
        [
            "plan",
            "--model",
            "llama-3.1-8b",
            "--concurrency",
            "4",
            "--num-requests",
            "12",
            "--input-len",
            "256",
            "--output-len",
            "16",
            "--compare",
            str(measured),
        ],
        capsys,
    )
    assert code == 0
    assert "planner vs measured run" in out and "+0%" in out
    assert "measured: bandwidth fraction of peak" in out
    code, _out, err = run_cli(
        ["plan", "--model", "llama-3.1-8b", "--concurrency", "1", "--compare", str(tmp_path / "x.json")], capsys
    )
    assert code == 2 and "no such file for --compare" in err
