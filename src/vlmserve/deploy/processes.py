"""Child processes that can be stopped completely: own process group, whole-tree kill, ports.

vLLM's API server forks an engine-core process which starts worker processes; stopping
only the PID we started leaves those behind holding memory and ports. So every engine
runs in its own session (process group), and stopping it signals the group *and* every
descendant psutil can still see (a descendant may have moved to another group).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import psutil

STOP_GRACE_S = 15.0
"""How long a process tree gets to exit after SIGTERM before it is SIGKILLed."""


def start_process_group(argv: list[str], env: dict[str, str], log_path: Path, header: str = "") -> subprocess.Popen[bytes]:
    """Start argv in a new session, stdout and stderr appended to log_path.

    A header that cannot be written (the log's disk is full) is left out: a restart must not
    fail for want of one log line; what the process itself writes is lost until there is room."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file: IO[bytes] = open(log_path, "ab", buffering=0)
    if header:
        try:
            log_file.write(header.encode() + b"\n")
        except OSError:
            pass
    try:
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        log_file.close()  # the child holds its own descriptor


def tree_pids(pid: int) -> list[int]:
    """pid and all its living descendants."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def stop_process_tree(process: subprocess.Popen[bytes] | int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group and every descendant; SIGKILL whatever is left after grace_s.

    `process` is a Popen we started (it is reaped too) or the pid of a group leader found in
    a state file (see `matches_recorded`)."""
    leader = process if isinstance(process, int) else process.pid
    popen = None if isinstance(process, int) else process
    pids = tree_pids(leader)
    _signal_group(leader, signal.SIGTERM)
    _signal_pids(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        leader_done = popen.poll() is not None if popen is not None else True
        if leader_done and not _alive(pids):
            break
        pids = sorted(set(pids) | set(tree_pids(leader)))
        time.sleep(0.1)
    _signal_group(leader, signal.SIGKILL)
    _signal_pids(pids, signal.SIGKILL)
    if popen is not None:
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    psutil.wait_procs(_procs(pids), timeout=5)


def created_at(pid: int) -> float | None:
    """When a process started (psutil's create_time), or None when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def matches_recorded(pid: int, recorded_created_at: float | None) -> bool:
    """Is `pid` still the very process that was recorded (not a later one reusing the number)?"""
    now = created_at(pid)
    return now is not None and recorded_created_at is not None and abs(now - recorded_created_at) < 1.0


def kill_process_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group and every descendant at once, without asking first.

    For a hung process: a stopped (SIGSTOP) one leaves SIGTERM pending until it is continued,
    so the polite path of `stop_process_tree` would only wait out its grace period. The
    leader is not reaped here; whoever owns the Popen sees the exit code (-9) as for a crash."""
    pids = tree_pids(process.pid)
    _signal_group(process.pid, signal.SIGKILL)
    _signal_pids(pids, signal.SIGKILL)


def kill_process_group(pid: int) -> None:
    """SIGKILL a process group at once (what a crash or the OOM killer looks like)."""
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the child is its session's leader: its pgid is its pid
    except (ProcessLookupError, PermissionError):
        pass


def _signal_pids(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _procs(pids: Iterable[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return procs


def _alive(pids: Iterable[int]) -> bool:
    for proc in _procs(pids):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (we can bind it ourselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


QUIET_PORT_RANGE = (20000, 32000)
"""Below Linux's ephemeral range (32768-60999): the kernel never hands these to outgoing
connections, so a port found free here stays free while an engine takes ~20 s to bind it."""


def free_port_block(
    count: int, host: str = "127.0.0.1", attempts: int = 200, port_range: tuple[int, int] = QUIET_PORT_RANGE
) -> int:
    """First port of `count` consecutive free ports (for a gateway + its replicas), in `port_range`.

    Ports from bind(0) come from the ephemeral range, where any client connection on the
    machine may take them before a slow-starting engine binds; so look below that range.
    """
    chooser = random.Random(os.getpid() ^ time.monotonic_ns())
    low, high = port_range
    for _ in range(attempts):
        base = chooser.randrange(low, high - count)
        if all(port_is_free(host, base + offset) for offset in range(count)):
            return base
    raise RuntimeError(f"could not find {count} consecutive free ports in {low}-{high}")


def port_listeners(port: int) -> list[int]:
    """PIDs listening on a TCP port, where the OS lets us see them."""
    pids = []
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return []
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            pids.append(conn.pid)
    return sorted(set(pids))


def describe_pid(pid: int) -> str:
    """'pid 123 (python -m vllm...)' for error messages."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())[:80]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        command = "?"
    return f"pid {pid} ({command})"


def log_tail(log_path: Path, lines: int = 12) -> list[str]:
    """The last lines of a log file (decoded leniently)."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
