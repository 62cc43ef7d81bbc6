"""`vlmserve engine sim` refuses bad flags with one line and exit code 2."""

from __future__ import annotations

import socket
import subprocess

import pytest

from vlmserve.cli.app import main


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return int(exit_info.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--profile", "nope"], "error: unknown sim profile 'nope'; choose one of: a100-8b, a10g-8b,"),
        (["--profile", "h100-8b", "--ttft-ms", "5"], "error: --profile and --ttft-ms/--itl-ms exclude each other"),
        (["--gpu", "h100", "--itl-ms", "5"], "error: --gpu and --ttft-ms/--itl-ms exclude each other"),
        (["--output-len", "gauss:3"], "error: output length distribution 'gauss:3' is not understood"),
        (["--error-codes", "404"], "error: --error-codes takes 5xx status codes, got 404"),
        (["--error-rate", "1.5"], "error: --error-rate must be between 0 and 1"),
        (["--swap-answer-rate", "-0.1"], "error: --swap-answer-rate must be between 0 and 1, got -0.1"),
        (["--num-kv-blocks", "10"], "error: the KV cache (10 blocks of 16 tokens = 160 tokens) cannot hold one request"),
        (["--api-server-count", "0"], "error: --api-server-count must be at least 1, got 0"),
        (["--api-server-count", "1000000000"], "error: --api-server-count must be at most 1024, got 1000000000"),
        (
            ["--mm-preprocess-ms-per-image", "-5"],
            "error: --mm-preprocess-ms-per-image and --mm-preprocess-ms-per-megapixel must not be negative",
        ),
        (
            ["--mm-preprocess-ms-per-megapixel", "nan"],
            "error: --mm-preprocess-ms-per-megapixel must be a finite number of milliseconds, got nan",
        ),
        (["--mm-cache-items", "-1"], "error: --mm-cache-items must be 0 (no cache) or more, got -1"),
        (["--max-num-encoder-input-tokens", "0"], "error: --max-num-encoder-input-tokens must be at least 1"),
        (
            ["--encoder-cache-size", "-5"],
            "error: --encoder-cache-size must be at least 1 (leave it out for --max-num-batched-tokens), got -5",
        ),
        (
            ["--port", "70000"],
            "error: --port must be between 1 and 65535 (or 0 for a free port), got 70000",
        ),  # the last --port wins
        # NaN passes a `< 0` check: a NaN latency or delay would reach the engine's sleeps
        (["--ttft-ms", "nan"], "error: --ttft-ms and --itl-ms must be 0 or more milliseconds: --ttft-ms is nan"),
        (["--itl-ms", "inf"], "error: --ttft-ms and --itl-ms must be 0 or more milliseconds: --itl-ms is inf"),
        (["--itl-ms", "-1"], "error: --ttft-ms and --itl-ms must be 0 or more milliseconds: --itl-ms is -1.0"),
        (["--startup-delay", "nan"], "error: --startup-delay must be 0 or more seconds, got nan"),
        (["--stall-s", "nan"], "error: --stall-s must be 0 or more seconds (leave it out to stall for good), got nan"),
    ],
)
def test_bad_flags_get_one_line_errors(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run_cli(["engine", "sim", "--port", "0", *flags], capsys)
    assert code == 2
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_port_in_use_is_a_clear_error(vlmserve_cmd: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*vlmserve_cmd, "engine", "sim", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}"), result.stderr
    assert "pick another --port" in result.stderr and "Traceback" not in result.stderr
