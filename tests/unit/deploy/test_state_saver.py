"""Saving state.json: atomic, a failed write an alarm said once per episode, recovery clearing it.

The failures are real ones from the file system, not mocks: a directory where state.json (or its
temporary file) must go makes the rename (or the create) fail as a full disk would make the write
fail. The full disk itself (ENOSPC from a filled tmpfs) is tests/integration/deploy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vlmserve.deploy.state import DeploymentState, MemberRecord, read_state, write_state
from vlmserve.deploy.state_saver import HEARTBEAT_S, RETRY_S, StateSaver, marker_path, slot_path, state_alarm


def a_state(pid: int = 1234) -> DeploymentState:
    return DeploymentState(name="web", updated_at=1000.0, replicas=[MemberRecord(role="replica", pid=pid, state="ready")])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.hostile("state.json cannot be written (its temporary file cannot be made): the previous file stays whole")
def test_a_failed_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_state(path, a_state(pid=1))
    blocker = tmp_path / f".state.json.tmp-{os.getpid()}"
    (blocker / "inside").mkdir(parents=True)  # where the temporary file must go, a directory
    with pytest.raises(OSError):
        write_state(path, a_state(pid=2))
    saved = read_state(path)
    assert saved is not None and saved.replicas[0].pid == 1
    (blocker / "inside").rmdir()
    blocker.rmdir()
    write_state(path, a_state(pid=3))
    assert read_state(path).replicas[0].pid == 3  # type: ignore[union-attr]
    assert [item.name for item in tmp_path.iterdir()] == ["state.json"]  # no temporary file left behind


@pytest.mark.hostile(
    "state.json cannot be saved for a while: one line per episode, a note for status, and the next successful write clears it"
)
def test_failing_saves_are_one_alarm_and_recovery_clears_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    said: list[str] = []
    clock = Clock()
    saver = StateSaver(path, said.append, clock=clock)
    assert saver.save(a_state()) and slot_path(path).stat().st_size > 0  # the note's room, taken while there is some
    assert state_alarm(read_state(path), path, now=clock.now) is None  # type: ignore[arg-type]

    path.unlink()
    (path / "in-the-way").mkdir(parents=True)  # the rename over state.json now fails, every time
    for _ in range(5):
        clock.now += RETRY_S
        assert not saver.save(a_state())
        assert not saver.due() and saver.due(clock.now + RETRY_S)  # retried every RETRY_S while failing
    assert saver.failing and saver.failures == 5
    assert len(said) == 1 and said[0].startswith(f"could not save the deployment state to {path}: [Errno"), said
    alarm = state_alarm(a_state(), path, now=clock.now)
    assert alarm is not None and alarm.startswith("state could not be saved since") and "[Errno" in alarm, alarm

    (path / "in-the-way").rmdir()
    path.rmdir()
    clock.now += RETRY_S
    assert saver.save(a_state())
    assert not saver.failing and len(said) == 2 and said[1].startswith("deployment state saved again after 5 failed write(s)")
    saved = read_state(path)
    assert saved is not None and saved.save_failures == 5 and saved.last_save_error and "[Errno" in saved.last_save_error
    assert saved.heartbeat_s == HEARTBEAT_S
    assert state_alarm(saved, path, now=clock.now) is None
    assert not saver.due(clock.now + HEARTBEAT_S - 1) and saver.due(clock.now + HEARTBEAT_S)


def test_status_falls_back_to_the_marker_then_to_the_heartbeat(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = a_state()
    state.heartbeat_s = HEARTBEAT_S
    assert state_alarm(state, path, now=1000.0 + HEARTBEAT_S) is None  # fresh enough
    stale = state_alarm(state, path, now=1000.0 + 10 * HEARTBEAT_S)
    assert stale is not None and stale.startswith("state is stale: last saved at") and "(100 s ago)" in stale
    marker_path(path).touch()  # no room for the note's text: the empty marker alone says it
    marked = state_alarm(state, path, now=1000.0 + HEARTBEAT_S)
    assert marked is not None and marked.startswith("state could not be saved since") and "(the write failed)" in marked


def test_status_marks_recorded_members_whose_process_is_gone() -> None:
    state = DeploymentState(name="web", replicas=[
        MemberRecord(role="replica", index=0, pid=os.getpid(), pid_created_at=_created(os.getpid()), state="ready"),
        MemberRecord(role="replica", index=1, pid=999_999_999, pid_created_at=1.0, state="ready"),
    ])  # fmt: skip
    shown = state.with_alarm("state could not be saved since then")
    assert shown.alarm == "state could not be saved since then"
    assert [member.state for member in shown.replicas] == ["ready", "unknown (recorded pid gone; state not saved since)"]
    assert state.alarm is None and "alarm" not in _saved_keys(state)


def _created(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


def _saved_keys(state: DeploymentState) -> set[str]:
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "state.json"
        write_state(path, state.with_alarm("x"))
        return set(json.loads(path.read_text()))
