"""A real local Ray cluster (one head node) for a test module, stopped cleanly at the end.

    with start_ray_head(tmp_path, num_cpus=2) as head:
        ... vlmserve batch --runner ray --ray-address head.address ...

`ray start --head --block` runs in its own session with a private --temp-dir and a free
port, so it never joins (or is joined by) another Ray on the machine, and `ray stop` —
which stops every Ray of the user — is never needed: the test stops exactly the processes
it started (the head's process group, then any worker that outlived it, by pid).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.conftest import REPO_ROOT
from tests.helpers.procs import free_port


@dataclass(frozen=True)
class RayHead:
    address: str
    temp_dir: Path
    log_path: Path
    pid: int
    client_env: dict[str, str]
    """What a driver needs in its environment to join: Ray's token authentication (its default for
    clusters started where a token exists) with this head's own token, never the user's ~/.ray one."""


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _session_processes(temp_dir: Path) -> list[psutil.Process]:
    """Ray workers re-parent themselves away from the head; they carry the temp dir on their command line
    (or in their environment's session), which is how the ones this head started are found."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(temp_dir) in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@contextmanager
def start_ray_head(workdir: Path, *, num_cpus: int = 2, ready_timeout_s: float = 90.0) -> Iterator[RayHead]:
    """Start a head node; yield its address; stop it and every process it started."""
    port = free_port()
    temp_dir = Path(tempfile.gettempdir()) / f"vlmserve-ray-{port}"  # short: Ray's socket paths are length-limited
    log_path = workdir / f"ray-head-{port}.log"
    token_path = workdir / f"ray-token-{port}"
    token_path.write_text(secrets.token_hex(32))
    client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        **client_env,
    }
    argv = [
        _ray_cli(),
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--num-cpus",
        str(num_cpus),
        "--include-dashboard=false",
        "--temp-dir",
        str(temp_dir),
        "--disable-usage-stats",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(process, port, log_path, ready_timeout_s)
        yield RayHead(address=f"127.0.0.1:{port}", temp_dir=temp_dir, log_path=log_path, pid=process.pid, client_env=client_env)
    finally:
        _stop(process, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_ready(process: subprocess.Popen, port: int, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}: {log_path.read_text(errors='replace')[-2000:]}")
        if "Ray runtime started" in log_path.read_text(errors="replace"):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                pass
        time.sleep(0.2)
    raise RuntimeError(f"ray head not ready in {timeout_s} s: {log_path.read_text(errors='replace')[-2000:]}")


def _stop(process: subprocess.Popen, temp_dir: Path) -> None:
    started = {proc.pid: proc for proc in [*_descendants(process.pid), *_session_processes(temp_dir)]}
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # the head's own session: only what it started
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    started |= {proc.pid: proc for proc in _session_processes(temp_dir)}
    _, alive = psutil.wait_procs(list(started.values()), timeout=10)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
