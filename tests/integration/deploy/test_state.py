"""The typed deployment state: one member list, a faithful round trip, and reconciliation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from vlmserve.deploy.state import DeploymentState, MemberRecord, read_state, write_state


def state_with(replica_pids: list[int | None], gateway_pid: int | None) -> DeploymentState:
    def created(pid: int | None) -> float | None:
        return psutil.Process(pid).create_time() if pid and psutil.pid_exists(pid) else 1.0

    replicas = [MemberRecord(role="replica", index=index, port=9001 + index, pid=pid, pid_created_at=created(pid),
                             state="ready") for index, pid in enumerate(replica_pids)]  # fmt: skip
    gateway = MemberRecord(role="gateway", port=9000, pid=gateway_pid, pid_created_at=created(gateway_pid),
                           state="ready")  # fmt: skip
    return DeploymentState(name="web", replicas=replicas, gateway=gateway)


def test_members_are_the_replicas_then_the_gateway() -> None:
    state = state_with([None, None], None)
    assert [member.label for member in state.members] == ["replica 0", "replica 1", "gateway"]
    assert [member.label for member in state.model_copy(update={"gateway": None}).members] == ["replica 0", "replica 1"]


def test_round_trip_through_the_file_keeps_every_field(tmp_path: Path) -> None:
    state = state_with([os.getpid()], None)
    path = tmp_path / "state.json"
    write_state(path, state)
    raw = json.loads(path.read_text())
    assert raw["replicas"][0]["pid"] == os.getpid() and raw["gateway"]["role"] == "gateway"
    assert read_state(path) == state
    path.write_text("{not json")
    assert read_state(path) is None  # unreadable is 'no state', not a crash


def test_reconcile_names_orphans_and_marks_the_rest_stopped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = state_with([child.pid, None], 999_999_999)  # a live orphan, a never-started one, a gone one
        assert not state.supervisor_alive()
        assert [member.label for member in state.living_members()] == ["replica 0"]
        shown = state.reconciled()
        assert shown.replicas[0].state == "orphaned: run `vlmserve down web`"
        assert shown.replicas[1].state == "stopped (supervisor gone)" and shown.gateway.state == "stopped (supervisor gone)"
        assert state.replicas[0].state == "ready"  # the recorded state itself is left as it was
    finally:
        child.kill()
        child.wait()
