"""Process plumbing shared by the test helpers that start real servers (sim engines, gateways, Prometheus)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
