"""Start a real `vlmserve gateway` in a subprocess on a free port, for tests that need one.

(Used by the batch and observe tests; the gateway's own tests build the app in-process.)
`wait_http_ok` and `stop_process` also serve other real servers those tests start (Prometheus).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.procs import free_port, stop_process, wait_http_ok

__all__ = ["GatewayProcess", "free_port", "start_gateway", "start_gateways", "stop_process", "wait_http_ok"]


@dataclass
class GatewayProcess:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def start_gateway(replica_urls: list[str], log_dir: Path, *flags: str, ready_timeout_s: float = 30.0) -> Iterator[GatewayProcess]:
    """Run the gateway until the block ends; flags are extra CLI flags (e.g. '--max-in-flight', '2')."""
    with start_gateways(replica_urls, log_dir, [flags], ready_timeout_s=ready_timeout_s) as (gateway,):
        yield gateway


@contextmanager
def start_gateways(
    replica_urls: list[str],
    log_dir: Path,
    flag_sets: Sequence[Sequence[str]],
    *,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> Iterator[list[GatewayProcess]]:
    """One gateway per flag set, all started before waiting (each start costs seconds of imports);
    `env` is added to every gateway's environment."""
    gateways: list[GatewayProcess] = []
    try:
        for flags in flag_sets:
            port = free_port()
            argv = [sys.executable, "-m", "vlmserve", "gateway", "--host", "127.0.0.1", "--port", str(port)]
            for url in replica_urls:
                argv += ["--replica", url]
            log_path = log_dir / f"gateway-{port}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [*argv, *flags], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
                )
            gateways.append(GatewayProcess(process, port, log_path))
        for gateway in gateways:
            wait_http_ok(f"{gateway.base_url}/health", gateway.process, gateway.log_path, "gateway", ready_timeout_s)
            wait_listening_line(gateway, ready_timeout_s)
        yield gateways
    finally:
        for gateway in gateways:
            stop_process(gateway.process)


LISTENING_LINE = "vlmserve gateway listening on"
"""What the gateway prints once it serves; with `--workers N`, once every worker listens."""


def wait_listening_line(gateway: GatewayProcess, timeout_s: float) -> None:
    """Until the gateway has printed its listening line. With workers, the first one to listen
    answers /health before the others are up, so a test spreading connections over the workers
    waits for this line as well."""
    deadline = time.monotonic() + timeout_s
    while LISTENING_LINE not in gateway.log_path.read_text(errors="replace"):
        if gateway.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"gateway answered /health but never printed {LISTENING_LINE!r}: "
                f"{gateway.log_path.read_text(errors='replace')[-2000:]}"
            )
        time.sleep(0.05)
