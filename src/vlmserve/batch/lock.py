"""One writer per output file: an exclusive `flock` on `OUTPUT.lock`, held for the whole run.

Rules kept:
- the lock is taken before the output is read (the resume scan, cutting a partial last
  line) and held until the last result is written and fsynced, so two runs can never
  interleave lines or answer one custom_id twice;
- a second run on the same output refuses at once, as one line naming the holder's pid;
- the kernel drops a `flock` when its process dies (SIGKILL included), so a lock file left
  behind never blocks a rerun; the file is therefore left in place (removing it would race
  with a run that has just opened it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vlmserve.errors import UserError

LOCK_SUFFIX = ".lock"


def lock_path_for(output_path: Path) -> Path:
    """`out.jsonl` → `out.jsonl.lock`, beside it."""
    return output_path.with_name(output_path.name + LOCK_SUFFIX)


def _holder_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _write_pid(fd: int) -> None:
    """Best effort: the pid only makes the refusal message better (a full disk may refuse it)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


@contextmanager
def output_lock(output_path: Path) -> Iterator[None]:
    """Hold the output's lock for the block; UserError if another run holds it."""
    lock_path = lock_path_for(output_path)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise UserError(
            f"--output: cannot create the lock file {lock_path} ({err.strerror}); pick an --output in a writable folder"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            who = f"another batch run (pid {holder})" if holder else "another batch run"
            raise UserError(
                f"{output_path} is being written by {who}; wait for it to finish (or stop it), or pick another --output"
            ) from None
        _write_pid(fd)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock
