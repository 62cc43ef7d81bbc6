"""The sim engine's cold start: the port is taken at once, refuses connections until the delay
has passed (as vLLM 0.32 binds before loading and listens once ready), then serves; the phases
are logged in vLLM's words."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx
import pytest

from tests.helpers.procs import free_port, stop_process
from tests.helpers.sim import sim_engine_argv

MODEL = "cold-model"
COLD_START_S = 3.0


def _connect_refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def test_cold_start_refuses_then_serves(tmp_path) -> None:
    port = free_port()
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            sim_engine_argv(port, model=MODEL, ttft_ms=1, itl_ms=1, cold_start_s=COLD_START_S),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started = time.monotonic()
    try:
        deadline = started + 20
        while "port" not in log_path.read_text() or "bound" not in log_path.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        # bound: nobody else can take the port; not listening: a client is refused, not kept waiting
        with socket.socket() as intruder, pytest.raises(OSError):
            intruder.bind(("127.0.0.1", port))
        if time.monotonic() - started < COLD_START_S - 0.5:  # a loaded machine may have used the delay up
            assert _connect_refused(port)
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline + 10, log_path.read_text()
            time.sleep(0.05)
        assert time.monotonic() - started >= COLD_START_S
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=10,
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200
        text = log_path.read_text()
        assert "Model loading took 0.00 GiB memory and 1.800000 seconds" in text, text
        assert "init engine (profile, create kv cache, warmup model) took 1.20 s" in text, text
    finally:
        stop_process(process, timeout_s=10.0)


@pytest.mark.hostile("a sim engine asked for a negative or NaN cold start")
@pytest.mark.parametrize("value", ["-1", "nan"])
def test_bad_cold_start_is_one_line(value: str, vlmserve_cmd: list[str]) -> None:
    result = subprocess.run(
        [*vlmserve_cmd, "engine", "sim", "--port", "0", "--cold-start-s", value], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: --cold-start-s must be 0 or more seconds, got {float(value)}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
