"""Saving a running deployment's state.json: a failed write is an alarm, never the end of supervision.

The supervisor keeps its members in memory and only *reports* them through state.json; `status`
and `down` read the file. So when a write fails (the state directory's disk is full, its mount
went read-only) nothing about supervision changes: the supervisor carries on from memory, and
the failure is made visible instead:

- one line in the supervisor's events when a failure episode starts (not one per retry), and one
  when the state is saved again, saying how many writes failed meanwhile;
- a note beside state.json that `status` reads to say "state could not be saved since ... (the
  error)". A full disk has no room for a new note, so the room is taken while there is some: with
  the first successful save the supervisor writes `state.save-status`, `SLOT_BYTES` long, and on a
  failure it overwrites those blocks in place, which needs no new ones. Where even that fails
  (a copy-on-write file system, a read-only mount), an empty `state.unsaved` is created (an
  inode, no data block: its mtime says when); and where nothing at all can be written, `status`
  still compares the state's own `updated_at` (rewritten every `HEARTBEAT_S`) with the clock;
- the counters `save_failures`, `last_save_error` and `last_save_error_at` in the state itself,
  which reach the file (and `status --json`) with the next write that succeeds.

The next successful write (space returned) removes the marker and clears the alarm.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from vlmserve.deploy.state import DeploymentState, write_state

HEARTBEAT_S = 10.0
"""The supervisor rewrites state.json at least this often, so its age tells `status` it is current."""
RETRY_S = 2.0
"""While writes fail, how often the supervisor tries again (each try is one small file, removed at once)."""
STALE_AFTER_HEARTBEATS = 3
"""A live supervisor's state older than this many heartbeats is called stale by `status`."""
SLOT_NAME = "state.save-status"
SLOT_BYTES = 512
"""The save-status note's fixed size: room for the time and the error, allocated while there is room."""
MARKER_NAME = "state.unsaved"
_OK = "ok"
_FAILING = "failing"


def slot_path(state_file: Path) -> Path:
    """Where the save-status note of a state file lives (beside it)."""
    return state_file.with_name(SLOT_NAME)


def marker_path(state_file: Path) -> Path:
    """Where the empty 'could not be saved' marker (the fallback) of a state file lives."""
    return state_file.with_name(MARKER_NAME)


class StateSaver:
    """Writes one deployment's state.json for its supervisor; `save` never raises on a write failure."""

    def __init__(self, path: Path, say: Callable[[str], None], clock: Callable[[], float] = time.time) -> None:
        """say: where the episode's two lines go (the supervisor's events)."""
        self.path = path
        self._say = say
        self._clock = clock
        self.failing_since: float | None = None
        self.failures = 0
        """Failed writes in this supervisor's life."""
        self.episode_failures = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_saved_at: float | None = None
        self.last_try_at: float | None = None

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def due(self, now: float | None = None) -> bool:
        """Is a write due without any change: a retry while failing, else the heartbeat?"""
        now = self._clock() if now is None else now
        if self.failing:
            return self.last_try_at is None or now - self.last_try_at >= RETRY_S
        return self.last_saved_at is None or now - self.last_saved_at >= HEARTBEAT_S

    def save(self, state: DeploymentState) -> bool:
        """Write `state` (with this saver's counters in it); True when it reached the disk."""
        now = self._clock()
        self.last_try_at = now
        state.heartbeat_s = HEARTBEAT_S
        state.save_failures = self.failures
        state.last_save_error = self.last_error
        state.last_save_error_at = self.last_error_at
        try:
            write_state(self.path, state)
        except OSError as problem:
            self._failed(problem, now)
            return False
        self._saved(now)
        return True

    def _failed(self, problem: OSError, now: float) -> None:
        self.failures += 1
        self.episode_failures += 1
        self.last_error = _describe(problem)
        self.last_error_at = now
        if self.failing_since is not None:
            return  # the episode's line is out already: a full disk must not fill the log with retries
        self.failing_since = now
        self._write_marker(now)
        self._say(
            f"could not save the deployment state to {self.path}: {self.last_error}; supervision goes on "
            f"from memory and `vlmserve status` shows the state as not saved until a write succeeds "
            f"(retrying every {RETRY_S:g} s, reported once)"
        )

    def _saved(self, now: float) -> None:
        first = self.last_saved_at is None
        self.last_saved_at = now
        if self.failing_since is None:
            if first:  # take the note's room while there is some; clear one an earlier supervisor left
                _write_slot(slot_path(self.path), _OK, create=True)
                with contextlib.suppress(OSError):
                    marker_path(self.path).unlink()
            return
        since, count = self.failing_since, self.episode_failures
        self.failing_since = None
        self.episode_failures = 0
        _write_slot(slot_path(self.path), _OK, create=True)
        with contextlib.suppress(OSError):
            marker_path(self.path).unlink()
        self._say(
            f"deployment state saved again after {count} failed write(s) since {time.strftime('%H:%M:%S', time.localtime(since))}"
        )

    def _write_marker(self, since: float) -> None:
        """Say the episode where `status` looks: in the note's own blocks, else as an empty marker."""
        if _write_slot(slot_path(self.path), f"{_FAILING}\n{since}\n{self.last_error}", create=False):
            return
        with contextlib.suppress(OSError):
            os.close(os.open(marker_path(self.path), os.O_WRONLY | os.O_CREAT, 0o644))


def _write_slot(slot: Path, text: str, *, create: bool) -> bool:
    """Overwrite the note in place, padded to SLOT_BYTES (no new block needed once it exists)."""
    data = text.encode(errors="replace")[: SLOT_BYTES - 1] + b"\n"
    data = data.ljust(SLOT_BYTES, b" ")
    try:
        descriptor = os.open(slot, os.O_WRONLY | (os.O_CREAT if create else 0), 0o644)
    except OSError:
        return False
    try:
        return os.pwrite(descriptor, data, 0) == len(data)
    except OSError:
        return False
    finally:
        os.close(descriptor)


def _describe(problem: OSError) -> str:
    """'[Errno 28] No space left on device' without the temporary file's name."""
    if problem.errno is not None and problem.strerror:
        return f"[Errno {problem.errno}] {problem.strerror}"
    return str(problem) or type(problem).__name__


def read_marker(state_file: Path) -> tuple[float, str | None] | None:
    """(since, error) when the supervisor noted that state_file could not be saved, else None."""
    try:
        with open(slot_path(state_file), "rb") as note:
            lines = note.read(SLOT_BYTES).decode(errors="replace").splitlines()
    except OSError:
        lines = []
    if len(lines) >= 2 and lines[0] == _FAILING:
        try:
            since = float(lines[1])
        except ValueError:
            since = 0.0
        error = lines[2].strip()[:200] if len(lines) > 2 and lines[2].strip() else None
        return since, error
    try:
        return marker_path(state_file).stat().st_mtime, None
    except OSError:
        return None


def state_alarm(state: DeploymentState, state_file: Path, now: float | None = None) -> str | None:
    """Why a live supervisor's recorded state may be out of date, in one line; None when it is current."""
    now = time.time() if now is None else now
    marker = read_marker(state_file)
    if marker is not None:
        since, error = marker
        return (
            f"state could not be saved since {_clock_time(since)} ({error or 'the write failed'}); "
            f"what follows is the last state saved, at {_clock_time(state.updated_at)}"
        )
    if state.heartbeat_s and state.updated_at and now - state.updated_at > STALE_AFTER_HEARTBEATS * state.heartbeat_s:
        return (
            f"state is stale: last saved at {_clock_time(state.updated_at)} ({now - state.updated_at:.0f} s ago) "
            f"though the supervisor saves it every {state.heartbeat_s:g} s; it may not be able to write it"
        )
    return None


def _clock_time(moment: float | None) -> str:
    if not moment:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))
