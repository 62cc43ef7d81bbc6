"""The members of a running deployment: what each process is (its plan) and how it is doing.

A `ProcessPlan` is fixed before anything starts (argv, environment, address, log, the
configuration it must serve); a `ManagedProcess` is the plan plus its live history (the
process, state, restarts, back-off). `record()` turns one into the `MemberRecord` that
state.json holds, so the supervisor and `status`/`down` share one shape.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vlmserve.deploy.readiness import ServedConfig
from vlmserve.deploy.state import MemberRecord, Role
from vlmserve.engines.launcher import ExpectedConfig

ProcessState = Literal["pending", "starting", "ready", "restarting", "failed", "stopped", "standby", "draining"]
"""standby: planned, not running (autoscale may start it); draining: out of the gateway's members,
its requests in flight finishing before it stops."""

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_AFTER_S = 120.0
"""A process that stayed up this long has its back-off reset to the start value."""


@dataclass
class ProcessPlan:
    """One process to supervise: what to run, where it listens, how to know it's right."""

    role: Role
    index: int
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    log_path: Path
    expected: ExpectedConfig | None
    """What a ready replica must serve; None for the gateway (ready means /health answers)."""
    devices: str = ""
    scheme: Literal["http", "https"] = "http"

    @property
    def label(self) -> str:
        return f"replica {self.index}" if self.role == "replica" else "gateway"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


@dataclass
class ManagedProcess:
    """A supervised process and its history."""

    plan: ProcessPlan
    process: subprocess.Popen[bytes] | None = None
    state: ProcessState = "pending"
    restarts: int = 0
    started_at: float | None = None
    ready_at: float | None = None
    last_exit_code: int | None = None
    backoff_s: float = BACKOFF_START_S
    restart_at: float | None = None
    served: ServedConfig | None = None
    pid_created_at: float | None = None
    """The process's start time as the OS reports it: with the pid, it identifies the process
    for `vlmserve down` even after the supervisor is gone (pids are reused)."""
    kill_reason: str | None = None
    """Set when the supervisor killed the process itself (hung); the exit it causes is not a crash."""
    last_restart_reason: str | None = None
    log_offset: int = 0
    """Where the current start's lines begin in its log (for reading its cold-start phases)."""
    cold_start: dict[str, float] | None = None
    """The last start's phases from the engine's own log lines (deploy.cold_start)."""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def record(self) -> MemberRecord:
        """This member as state.json records it."""
        return MemberRecord(
            role=self.plan.role,
            index=self.plan.index,
            url=self.plan.url,
            port=self.plan.port,
            pid=self.pid,
            pid_created_at=self.pid_created_at,
            state=self.state,
            restarts=self.restarts,
            started_at=self.started_at,
            ready_at=self.ready_at,
            last_exit_code=self.last_exit_code,
            last_restart_reason=self.last_restart_reason,
            devices=self.plan.devices,
            log=str(self.plan.log_path),
            served=self.served.as_dict() if self.served else None,
            cold_start=self.cold_start,
        )
