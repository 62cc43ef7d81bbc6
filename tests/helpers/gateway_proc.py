"""Start a real `vlmserve gateway` in a subprocess on a free port, for tests that need one.

(Used by the batch and observe tests; the gateway's own tests build the app in-process.)
`wait_http_ok` and `stop_process` also serve other real servers those tests start (Prometheus).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers.sim import free_port

__all__ = ["GatewayProcess", "free_port", "start_gateway", "stop_process", "wait_http_ok"]


def wait_http_ok(url: str, process: subprocess.Popen, log_path: Path, what: str, timeout_s: float = 30.0) -> None:
    """Poll url until it answers 200; fail with the process's log if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready in {timeout_s} s: {log_path.read_text()[-2000:]}")
        time.sleep(0.1)


def stop_process(process: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited in time."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class GatewayProcess:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def start_gateway(replica_urls: list[str], log_dir: Path, *flags: str,
                  ready_timeout_s: float = 30.0) -> Iterator[GatewayProcess]:
    """Run the gateway until the block ends; flags are extra CLI flags (e.g. '--max-in-flight', '2')."""
    port = free_port()
    argv = [sys.executable, "-m", "vlmserve", "gateway", "--host", "127.0.0.1", "--port", str(port)]
    for url in replica_urls:
        argv += ["--replica", url]
    log_path = log_dir / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([*argv, *flags], stdout=log, stderr=subprocess.STDOUT)
    gateway = GatewayProcess(process, port, log_path)
    try:
        wait_http_ok(f"{gateway.base_url}/health", process, log_path, "gateway", ready_timeout_s)
        yield gateway
    finally:
        stop_process(process)
