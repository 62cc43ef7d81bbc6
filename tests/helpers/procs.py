"""Process plumbing shared by the test helpers that start real servers (sim engines, gateways, Prometheus)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from vlmserve.deploy.processes import QUIET_PORT_RANGE, free_port_block


def free_port() -> int:
    """A port nothing listens on right now, below the kernel's ephemeral range (free_port_block).

    Not bind(0): that port comes from the range outgoing connections draw their source ports from,
    and a test that started four gateways lost one to "port already in use" when another one's
    connection to Redis took its port in the seconds before it bound. A port is handed out once
    per test session: the ports are drawn at random, and two servers started together must not
    be given the same one."""
    while True:
        port = free_ports(1)
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def free_ports(count: int) -> int:
    """First of `count` consecutive free ports (free_port_block), in this test worker's own band of
    the range: under pytest-xdist (scripts/test) each worker draws from a separate
    slice, so two workers never start servers on the same port."""
    low, high = QUIET_PORT_RANGE
    width = (high - low) // _WORKERS
    start = low + _WORKER * width
    return free_port_block(count, port_range=(start, start + width))


_HANDED_OUT: set[int] = set()
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)  # set by pytest-xdist
_WORKERS = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)


def wait_http_ok(
    url: str,
    process: subprocess.Popen,
    log_path: Path,
    what: str,
    timeout_s: float = 30.0,
    accept: Callable[[int], bool] = lambda status: status == 200,
) -> None:
    """Poll url until its status is accepted; fail with the process's log if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {_log_tail(log_path)}")
        try:
            if accept(httpx.get(url, timeout=1.0).status_code):
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready in {timeout_s} s: {_log_tail(log_path)}")
        time.sleep(0.05)


def stop_process(process: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


def _log_tail(log_path: Path) -> str:
    try:
        return log_path.read_text(errors="replace")[-2000:]
    except OSError:
        return ""
