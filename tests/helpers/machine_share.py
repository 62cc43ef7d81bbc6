"""Tests marked `exclusive` run with the machine to themselves when pytest-xdist runs several workers.

A few tests bound a timing that the machine's load moves: the TTFT breakdown on the real engine
says the time on no clock is under half the engine's TTFT, which holds on a quiet machine and failed
when the other worker loaded both cores. Under `-n 2` every other test holds a shared lock on a
file all workers see while it runs, and an `exclusive` test takes that lock exclusively, so it
starts once the other worker's current test ends and the other worker waits until it is done.
The lock covers a test's whole run protocol, its fixtures' set-up and tear-down included: a module
fixture can keep the machine busy for minutes (the benchmark smokes run in one), and a lock taken
only around the test function let the breakdown test run beside it and fail.

A second lock (the turnstile) gives the exclusive test priority: every test holds it while it waits
for the machine lock, so an exclusive test that waits keeps the shared tests that come after it
behind it, and a stream of short shared tests cannot keep it waiting forever. `flock` locks end with the process that holds them, so
a crashed worker frees the others. In one process (no xdist) nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

MARKER = "exclusive"


def _lock_dir(config: pytest.Config) -> Path:
    """A folder every worker of this run shares: xdist gives each worker the base temp folder
    <run's folder>/popen-gwN, and pytest prunes old runs' folders as it always does."""
    return Path(config.option.basetemp).parent


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
    with ExitStack() as held:
        with _flock(turnstile, fcntl.LOCK_EX):  # held while this waits for the machine lock
            held.enter_context(_flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Around each test's set-up, call and tear-down (module and session fixtures included)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not item.config.option.basetemp:
        yield
        return
    with machine_share(_lock_dir(item.config), exclusive=item.get_closest_marker(MARKER) is not None):
        yield
