"""`vlmserve gateway` as a user runs it: bad flags are one line and exit 2; a good one serves and drains."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateway_fixtures import MODEL
from tests.helpers.gateway_proc import start_gateway
from tests.helpers.sim import SimHandle
from vlmserve.cli.app import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run `vlmserve gateway ARGS` in this process (no server starts when the flags are bad)."""
    with pytest.raises(SystemExit) as exited:
        main(["gateway", *args])
    return int(exited.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replica", "127.0.0.1:8001"], "must start with http:// or https://"),
        (["--replica", "http://127.0.0.1:1", "--policy", "fastest"], "unknown policy 'fastest'"),
        (["--replica", "http://127.0.0.1:1", "--keys-file", "/nonexistent/keys.yaml"], "does not exist"),
        (["--replica", "http://127.0.0.1:1", "--replica", "http://127.0.0.1:1"], "given twice"),
        # a socket would take 99999 modulo 65536 and listen on 34463
        (
            ["--replica", "http://127.0.0.1:1", "--port", "99999"],
            "--port must be between 1 and 65535 (or 0 for a free port), got 99999",
        ),
        (
            ["--replica", "http://127.0.0.1:1", "--port", "-1"],
            "--port must be between 1 and 65535 (or 0 for a free port), got -1",
        ),
        # NaN passes every comparison: a NaN health interval would stop the health checks, an infinite timeout never fires
        (
            ["--replica", "http://127.0.0.1:1", "--health-interval", "nan"],
            "--health-interval must be a positive number of seconds, got nan",
        ),
        (
            ["--replica", "http://127.0.0.1:1", "--first-token-timeout", "inf"],
            "--first-token-timeout must be a positive number of seconds, got inf",
        ),
        (
            ["--replica", "http://127.0.0.1:1", "--connect-timeout", "0"],
            "--connect-timeout must be a positive number of seconds, got 0.0",
        ),
        (
            ["--replica", "http://127.0.0.1:1", "--discover-interval", "nan"],
            "--discover-interval must be a positive number of seconds, got nan",
        ),
        (["--replica", "http://127.0.0.1:1", "--drain-timeout", "-1"], "--drain-timeout must be 0 or more seconds, got -1.0"),
        (["--replica", "http://127.0.0.1:1", "--max-body-bytes", "-1"], "--max-body-bytes must be at least 1, got -1"),
        (["--replica", "http://127.0.0.1:1", "--prefix-load-factor", "nan"], "--prefix-load-factor must be at least 1.0"),
        (["--replica", "http://127.0.0.1:1", "--max-in-flight", "-1"], "--max-in-flight must be 0 or more (0 = no cap), got -1"),
        (["--replica", "http://127.0.0.1:1", "--queue-limit-batch", "-5"], "--queue-limit-batch must be 0 or more"),
    ],
)
def test_bad_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, stderr = run_cli(capsys, *args)
    assert code == 2
    assert stderr.startswith("error: ") and message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_missing_replica_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = run_cli(capsys)
    assert code == 2 and "no replicas given: pass --replica URL" in stderr and "Traceback" not in stderr


def test_port_in_use_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = run_cli(capsys, "--replica", "http://127.0.0.1:1", "--port", str(port), "--health-interval", "0.2")
    assert code == 2 and f"port {port} on 127.0.0.1 is already in use" in stderr.strip().splitlines()[-1]


def test_gateway_command_serves_and_exits_cleanly(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    urls = [engine.base_url for engine in constant_engines[:2]]
    with start_gateway(urls, tmp_path, "--policy", "prefix-affinity") as gateway:
        health = httpx.get(gateway.base_url + "/health", timeout=5).json()
        assert health["policy"] == "prefix-affinity" and all(r["healthy"] for r in health["replicas"])
        assert [m["id"] for m in httpx.get(gateway.base_url + "/v1/models", timeout=5).json()["data"]] == [MODEL]
        answer = httpx.post(
            gateway.base_url + "/v1/completions",
            json={"model": MODEL, "prompt": "x-ray of a molar", "max_tokens": 5, "ignore_eos": True},
            timeout=10,
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
        tokenize = httpx.post(gateway.base_url + "/v1/nonexistent-route", json={}, timeout=10)
        assert tokenize.status_code == 404  # other /v1 paths reach an engine, which answers for itself
        process = gateway.process
    assert process.wait(timeout=20) == 0
