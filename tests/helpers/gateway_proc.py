"""Start a real `vlmserve gateway` in a subprocess on a free port, for tests that need one.

(Used by the batch and observe tests; the gateway's own tests build the app in-process.)
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gateway exited with {process.returncode}: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{gateway.base_url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway not ready in {ready_timeout_s} s: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield gateway
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
