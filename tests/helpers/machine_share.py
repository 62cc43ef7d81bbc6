"""Tests marked `exclusive` run with the machine to themselves when pytest-xdist runs several workers.

A few tests bound a timing that the machine's load moves: the TTFT breakdown on the real engine
says the time on no clock is under half the engine's TTFT, which holds on a quiet machine and failed
once when the other worker loaded both cores. Under `-n 2` every other test holds a shared lock on a
file all workers see while it runs, and an `exclusive` test takes that lock exclusively, so it
starts once the other worker's current test ends and the other worker waits until it is done.

A second lock (the turnstile) gives the exclusive test priority: a worker takes it briefly before
each shared hold, and the exclusive test keeps it while it waits and runs, so a stream of short
shared tests cannot keep it waiting forever. `flock` locks end with the process that holds them, so
a crashed worker frees the others. In one process (no xdist) nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MARKER = "exclusive"


def _lock_dir(factory: pytest.TempPathFactory) -> Path:
    # each worker's base temp is <shared root>/popen-gwN: the parent is the same for all of them
    return factory.getbasetemp().parent


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextmanager
def machine_share(lock_dir: Path, exclusive: bool) -> Iterator[None]:
    """Hold the machine shared (most tests) or exclusively (`exclusive` tests) while the body runs."""
    turnstile, machine = lock_dir / "machine.turnstile.lock", lock_dir / "machine.lock"
    if exclusive:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(machine, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        fd = os.open(machine, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(fd)


@pytest.fixture(autouse=True)
def _machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    exclusive = request.node.get_closest_marker(MARKER) is not None
    with machine_share(_lock_dir(tmp_path_factory), exclusive):
        yield
