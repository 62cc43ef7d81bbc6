"""Saving a running deployment's state.json: a failed write is an alarm, never the end of supervision.

The supervisor keeps its members in memory and only *reports* them through state.json; `status`
and `down` read the file. So when a write fails (the state directory's disk is full, its mount
went read-only) nothing about supervision changes: the supervisor carries on from memory, and
the failure is made visible instead:

- one line in the supervisor's events when a failure episode starts (not one per retry), and one
  when the state is saved again, saying how many writes failed meanwhile;
- a small marker file beside state.json (`state.unsaved`) holding when the episode began and the
  error: `status` reads it and says "state could not be saved since ...". On a full disk even the
  marker's text may not fit, but creating an empty file needs no data block, so its mtime says
  when; and where no marker can be made at all, `status` still compares the state's own
  `updated_at` (rewritten every `HEARTBEAT_S`) with the clock;
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
MARKER_NAME = "state.unsaved"


def marker_path(state_file: Path) -> Path:
    """Where the 'could not be saved' marker of a state file lives (beside it)."""
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
        self.last_saved_at = now
        marker = marker_path(self.path)
        if self.failing_since is None:
            if self.failures == 0:
                with contextlib.suppress(OSError):
                    marker.unlink()  # one left by an earlier supervisor of this name that died failing
            return
        since, count = self.failing_since, self.episode_failures
        self.failing_since = None
        self.episode_failures = 0
        with contextlib.suppress(OSError):
            marker.unlink()
        self._say(
            f"deployment state saved again after {count} failed write(s) since {time.strftime('%H:%M:%S', time.localtime(since))}"
        )

    def _write_marker(self, since: float) -> None:
        """Best effort: create the marker (an inode, no data block), then try to put the details in it."""
        marker = marker_path(self.path)
        try:
            descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            return
        try:
            os.write(descriptor, f"{since}\n{self.last_error}\n".encode())
        except OSError:
            pass  # the empty marker's mtime still says when
        finally:
            os.close(descriptor)


def _describe(problem: OSError) -> str:
    """'[Errno 28] No space left on device' without the temporary file's name."""
    if problem.errno is not None and problem.strerror:
        return f"[Errno {problem.errno}] {problem.strerror}"
    return str(problem) or type(problem).__name__


def read_marker(state_file: Path) -> tuple[float, str | None] | None:
    """(since, error) from a state file's marker, or None when there is none."""
    marker = marker_path(state_file)
    try:
        stat = marker.stat()
        text = marker.read_text(errors="replace")
    except OSError:
        return None
    lines = text.splitlines()
    try:
        since = float(lines[0])
    except (IndexError, ValueError):
        since = stat.st_mtime
    error = lines[1].strip()[:200] if len(lines) > 1 and lines[1].strip() else None
    return since, error


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
