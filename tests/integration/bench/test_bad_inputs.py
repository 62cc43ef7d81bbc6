"""Every bad input is one clear line and exit code 2 — before any load is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL, bench_args, write_sharegpt
from tests.helpers.sim import free_port


def test_unreachable_url(cli):
    done = cli("bench", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--concurrency", 1, "--num-requests", 1)
    assert done.code == 2
    assert "cannot reach" in done.error_line and "--base-url" in done.error_line
    assert "Traceback" not in done.err


def test_wrong_model_lists_served_models(sim, cli):
    done = cli("bench", "--base-url", sim.base_url, "--model", "no-such-model", "--concurrency", 1, "--num-requests", 1)
    assert done.code == 2
    assert (
        done.error_line == f"error: model 'no-such-model' is not served at {sim.base_url} (it serves: {SIM_MODEL}); fix --model"
    )


def test_not_a_url(cli):
    done = cli("bench", "--base-url", "localhost:8000", "--model", "m", "--concurrency", 1, "--num-requests", 1)
    assert done.code == 2 and "give a URL like http://" in done.error_line


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--concurrency", 2, "--rate", 3, "--num-requests", 1], "--concurrency and --rate contradict"),
        (["--num-requests", 1], "give --concurrency N (closed loop) or --rate R (open loop)"),
        (["--concurrency", 1], "give --num-requests N or --duration S"),
        (["--concurrency", 1, "--num-requests", 1, "--duration", "5s"], "--num-requests and --duration contradict"),
        (["--concurrency", 1, "--num-requests", 1, "--arrival", "gamma"], "use them with --rate, not --concurrency"),
        (["--rate", 1, "--num-requests", 1, "--burstiness", "0.5"], "--burstiness applies to --arrival gamma only"),
        (["--concurrency", 1, "--duration", "soon"], "--duration 'soon': write it like 30s"),
        (["--concurrency", 0, "--num-requests", 1], "--concurrency: Input should be greater than or equal to 1"),
        (["--concurrency", 1, "--num-requests", 1, "--slo", "ttft_p95"], "--slo: 'ttft_p95' has no '='"),
        (["--concurrency", 1, "--num-requests", 1, "--slo", "latency_p95=5ms"], "--slo: unknown objective 'latency_p95'"),
        (["--concurrency", 1, "--num-requests", 1, "--slo", "ttft_p95=fast"], "--slo: 'fast' is not a duration"),
        (
            ["--concurrency", 1, "--num-requests", 1, "--slo", "vid:ttft_p95=1s"],
            "--slo: unknown request type 'vid' in 'vid:ttft_p95=1s'; use text, image, multi-image, video, audio",
        ),
        (
            ["--concurrency", 1, "--num-requests", 1, "--engine-traces", "4318"],
            "--engine-traces: '4318' is not HOST:PORT; write it like 127.0.0.1:4318",
        ),
        (["--concurrency", 1, "--num-requests", 1, "--extra-body", "{nope"], "--extra-body: not valid JSON"),
        (["--concurrency", 1, "--num-requests", 1, "--extra-body", "[1]"], "--extra-body: give a JSON object"),
        (["--concurrency", 1, "--num-requests", 1, "--dataset", "mixed"], "--dataset mixed needs --mix"),
        (
            ["--concurrency", 1, "--num-requests", 1, "--dataset", "mixed", "--mix", "text:x"],
            "--mix: weight 'x' of 'text' is not a number",
        ),
        (
            ["--concurrency", 1, "--num-requests", 1, "--dataset", "mixed", "--mix", "audio:1"],
            "--mix: 'audio:1' is not NAME:WEIGHT",
        ),
        (["--concurrency", 1, "--num-requests", 1, "--mix", "text:1"], "--mix needs --dataset mixed"),
        (["--concurrency", 1, "--num-requests", 1, "--dataset", "sharegpt"], "--dataset sharegpt needs --dataset-path FILE"),
        (["--concurrency", 1, "--num-requests", 1, "--dataset", "tweets"], "--dataset 'tweets': use one of random, sharegpt"),
        (["--concurrency", 1, "--num-requests", 1, "--multi-turn", "live"], "--multi-turn applies to --dataset sharegpt"),
        (["--concurrency", 1, "--num-requests", 1, "--image-size", "big"], "--image-size 'big': write it like 512x512"),
        (
            ["--concurrency", 1, "--num-requests", 1, "--dataset", "images", "--api", "completions"],
            "--dataset images needs --api chat",
        ),
        (
            ["--concurrency", 1, "--num-requests", 1, "--server-metrics-interval", -1],
            "--server-metrics-interval -1: give seconds ≥ 0",
        ),
        (
            ["--concurrency", 1, "--num-requests", 1, "--server-metrics-interval", "nan"],
            "--server-metrics-interval nan: give seconds ≥ 0",
        ),
        (
            ["--concurrency", 1, "--num-requests", 1, "--max-send-lag-ms", "nan"],
            "--max-send-lag-ms nan: give a positive number of milliseconds",
        ),
        (
            ["--concurrency", 1, "--num-requests", 1, "--max-send-lag-ms", 0],
            "--max-send-lag-ms 0: give a positive number of milliseconds",
        ),
    ],
)
def test_bad_flags(sim, cli, flags, expected):
    done = cli(*bench_args(sim, *flags))
    assert done.code == 2, done.err
    assert expected in done.error_line, done.err
    assert "Traceback" not in done.err


def dataset_error(sim, cli, path: Path, dataset: str = "sharegpt") -> str:
    done = cli(*bench_args(sim, "--dataset", dataset, "--dataset-path", path, "--concurrency", 1, "--num-requests", 2))
    assert done.code == 2, done.err
    assert "Traceback" not in done.err
    return done.error_line


def test_missing_dataset(sim, cli, tmp_path):
    assert "no such file" in dataset_error(sim, cli, tmp_path / "absent.json")


def test_missing_local_files_are_reported_before_the_server_is_tried(cli, tmp_path):
    """Nothing listens at the URL, but the missing file is the first thing the user must fix."""
    unreachable = "http://127.0.0.1:9"
    for flags, expected in (
        (["--dataset", "sharegpt", "--dataset-path", tmp_path / "absent.json"], "give a ShareGPT JSON file"),
        (["--dataset", "trace", "--dataset-path", tmp_path / "absent.jsonl"], "give a JSONL trace"),
        (["--dataset", "images", "--image-dir", tmp_path / "no-images"], "no such folder"),
        (["--dataset", "mixed", "--mix", "text:0.5,sharegpt:0.5"], "--dataset-path (none): no such file"),
    ):
        done = cli(
            "bench", "--base-url", unreachable, "--model", "m", "--no-progress", "--concurrency", 1, "--num-requests", 1, *flags
        )
        assert done.code == 2 and expected in done.error_line, done.err


def test_malformed_dataset(sim, cli, tmp_path):
    path = tmp_path / "object.json"
    path.write_text('{"conversations": []}')
    assert "not a ShareGPT file (expected a JSON array" in dataset_error(sim, cli, path)


def test_dataset_truncated_before_any_conversation(sim, cli, tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[{"id": "x", "conversations": [{"from": "human", "val')
    line = dataset_error(sim, cli, path)
    assert "no usable conversation" in line and "1 truncated at end of file" in line


def test_dataset_with_nothing_replayable(sim, cli, tmp_path):
    path = write_sharegpt(
        tmp_path / "bad.json",
        [{"id": "e", "conversations": []}, {"id": "g", "conversations": [{"from": "gpt", "value": "only a reply"}]}, 5],
    )
    line = dataset_error(sim, cli, path)
    assert "1 empty conversation" in line and "1 no user turn" in line and "1 not an object" in line


def test_trace_without_usable_lines(sim, cli, tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('garbage\n{"input_length": 3}\n')
    line = dataset_error(sim, cli, path, dataset="trace")
    assert "no usable trace line" in line and "1 not JSON" in line and "no timestamp" in line


def test_unreadable_images(sim, cli, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"\x89PNG truncated")
    done = cli(*bench_args(sim, "--dataset", "images", "--image-dir", folder, "--concurrency", 1, "--num-requests", 1))
    assert done.code == 2 and "no readable images (1 unreadable: a.png)" in done.error_line
    missing = cli(
        *bench_args(sim, "--dataset", "images", "--image-dir", tmp_path / "none", "--concurrency", 1, "--num-requests", 1)
    )
    assert missing.code == 2 and "no such folder" in missing.error_line


def test_bad_tokenizer_path(sim, cli, tmp_path):
    done = cli(*bench_args(sim, "--tokenizer", tmp_path / "nothing", "--concurrency", 1, "--num-requests", 1))
    assert done.code == 2 and "--tokenizer" in done.error_line and "give a local model directory" in done.error_line


def test_extra_body_the_server_rejects(sim, cli):
    done = cli(*bench_args(sim, "--concurrency", 1, "--num-requests", 1, "--extra-body", '{"max_tokens": -5}'))
    assert done.code == 2 and "rejected a test request: HTTP 400" in done.error_line
