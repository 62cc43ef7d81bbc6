"""A deployment's recorded state: its members, and which of their processes still run.

`<home>/deployments/<name>/state.json` (vlmserve.paths) holds the supervisor's pid and each
member's (every replica, then the gateway) pid, port, state, restarts and start time. The
supervisor rewrites it atomically on every change, so `status` and `down` (other processes)
never read half a file; they read it into the same typed `DeploymentState` the supervisor
wrote. A pid alone does not identify a process (pids are reused), so a recorded member is
alive only while a process with the same pid *and* the same start time runs (`reconcile`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import psutil
from pydantic import BaseModel, ConfigDict, ValidationError

from vlmserve import paths
from vlmserve.deploy import processes
from vlmserve.json_types import JSONObject

Role = Literal["replica", "gateway"]

Member = TypeVar("Member")


def member_list(replicas: Sequence[Member], gateway: Member | None) -> list[Member]:
    """Every replica in index order, then the gateway when there is one: the one order the
    supervisor starts and watches its members in (and stops them in, reversed)."""
    return [*replicas, *([gateway] if gateway is not None else [])]


class MemberRecord(BaseModel):
    """One supervised process as state.json records it."""

    model_config = ConfigDict(extra="allow")

    role: Role
    index: int = 0
    url: str = ""
    port: int = 0
    pid: int | None = None
    pid_created_at: float | None = None
    state: str = "pending"
    """pending, starting, ready, restarting, failed, stopped; or, as `status` reconciles it,
    'stopped (supervisor gone)' or 'orphaned: ...'."""
    restarts: int = 0
    started_at: float | None = None
    ready_at: float | None = None
    last_exit_code: int | None = None
    last_restart_reason: str | None = None
    devices: str = ""
    log: str = ""
    served: JSONObject | None = None
    cold_start: dict[str, float] | None = None
    """The last start's phases in seconds (start_to_ready_s, start_to_weights_s, ...; deploy.cold_start)."""

    @property
    def label(self) -> str:
        """'replica 0' or 'gateway'."""
        return f"replica {self.index}" if self.role == "replica" else self.role

    def is_running(self) -> bool:
        """Does the recorded process still run (same pid, same start time)?"""
        return bool(self.pid) and processes.matches_recorded(int(self.pid), self.pid_created_at)  # type: ignore[arg-type]


class DeploymentState(BaseModel):
    """The whole of state.json."""

    model_config = ConfigDict(extra="allow")

    name: str
    engine: str = "vllm"
    model: str = ""
    model_path: str = ""
    served_model_name: str | None = None
    device_kind: str = "unknown"
    supervisor_pid: int | None = None
    supervisor_started_at: float | None = None
    started_at: float | None = None
    updated_at: float | None = None
    endpoint: str | None = None
    open: bool = True
    gateway_note: str | None = None
    notes: list[str] = []
    replicas: list[MemberRecord] = []
    gateway: MemberRecord | None = None
    spec: JSONObject = {}
    heartbeat_s: float | None = None
    """How often the running supervisor rewrites this file even when nothing changed; a state much
    older than this, from a supervisor still alive, was not saved since (`state_saver.state_alarm`)."""
    save_failures: int = 0
    """Writes of this file that failed in this supervisor's life (a full disk, a read-only mount)."""
    last_save_error: str | None = None
    last_save_error_at: float | None = None
    autoscale: dict[str, Any] | None = None
    """With autoscale: the rule, the count it wants now and the recent scale events (Autoscaler.summary)."""
    alarm: str | None = None
    """Set by `status` only, never saved: why the table may be out of date (the state is stale or
    could not be saved since some time)."""

    @property
    def members(self) -> list[MemberRecord]:
        """Every replica, then the gateway when there is one."""
        return member_list(self.replicas, self.gateway)

    def is_stopped(self) -> bool:
        """True when no member runs any more: `status` then shows where it served, not a live URL."""
        return all(member.state.startswith("stopped") for member in self.members)

    def supervisor_alive(self) -> bool:
        """True when the supervisor that wrote this state is still running."""
        if not self.supervisor_pid:
            return False
        try:
            process = psutil.Process(int(self.supervisor_pid))
            return (
                process.is_running()
                and process.status() != psutil.STATUS_ZOMBIE
                and (abs(process.create_time() - float(self.supervisor_started_at or 0)) < 2.0)
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return False

    def living_members(self) -> list[MemberRecord]:
        """Members whose recorded process still runs."""
        return [member for member in self.members if member.is_running()]

    def reconciled(self) -> "DeploymentState":
        """What `status` shows when the supervisor is gone: orphans named, the rest stopped."""
        state = self.model_copy(deep=True)
        for member in state.members:
            if member.is_running():
                member.state = f"orphaned: run `vlmserve down {state.name}`"
                continue
            if member.state != "stopped":
                member.state = "stopped (supervisor gone)"
            member.started_at = None
        return state

    def with_alarm(self, alarm: str) -> "DeploymentState":
        """What `status` shows of a live supervisor's state that is out of date: the alarm, and
        each member whose recorded process is gone marked so (the supervisor, working from memory,
        may have restarted it under a pid the file does not know yet)."""
        state = self.model_copy(deep=True)
        state.alarm = alarm
        for member in state.members:
            if member.pid and member.state not in ("stopped", "failed") and not member.is_running():
                member.state = "unknown (recorded pid gone; state not saved since)"
        return state

    def mark_stopped(self) -> None:
        """Every member stopped (after `down` stopped what was left)."""
        for member in self.members:
            member.state = "stopped"
            member.started_at = None


def state_path(name: str) -> Path:
    return paths.deployment_dir(name) / "state.json"


def write_state(path: Path, state: DeploymentState) -> None:
    """Atomically replace a deployment's state file: the whole new file, or the old one untouched.

    The new text goes to a temporary file beside it, is flushed and fsynced, and only then renamed
    over state.json (then the directory is fsynced, so the rename survives a power cut). A write
    that fails (ENOSPC on a full disk) removes its temporary file and raises OSError; the previous
    state.json is still whole, and no half-written file is ever left for `status` to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (json.dumps(state.model_dump(mode="json", exclude={"alarm"}), indent=2, default=str) + "\n").encode()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(text)
            while view:
                view = view[os.write(descriptor, view) :]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort: not every file system allows it)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def read_state(path: Path) -> DeploymentState | None:
    """The state in a state.json, or None when there is none (or it is unreadable)."""
    try:
        return DeploymentState.model_validate_json(path.read_text())
    except (OSError, ValidationError):
        return None


def list_deployments() -> list[str]:
    root = paths.deployments_dir()
    if not root.is_dir():
        return []
    return sorted(item.name for item in root.iterdir() if (item / "state.json").is_file())


def format_uptime(started_at: float | None, now: float | None = None) -> str:
    """'1h02m', '3m05s', '12s', or '-' when not running."""
    if not started_at:
        return "-"
    seconds = int((now or time.time()) - started_at)
    if seconds >= 3600:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
