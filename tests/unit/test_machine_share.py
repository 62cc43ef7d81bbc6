"""The lock that gives `exclusive` tests the machine under pytest-xdist (tests/helpers/machine_share.py).

Each holder is a thread with its own descriptors: flock locks belong to an open file, so two threads
contend exactly as two worker processes do. The checks are on order, not on time: "still waiting"
is read after a pause long enough for a wrongly granted lock to have been taken.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tests.helpers.machine_share import machine_share

PAUSE_S = 0.3  # long enough for a holder that should not wait to get its lock


class Holder(threading.Thread):
    """Takes the machine (shared or exclusive), notes that it has it, and keeps it until released."""

    def __init__(self, lock_dir: Path, name: str, exclusive: bool, order: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.lock_dir, self.exclusive, self.order = lock_dir, exclusive, order
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        with machine_share(self.lock_dir, self.exclusive):
            self.order.append(self.name)
            self.holding.set()
            self.release.wait(30)


def test_shared_holders_run_together_and_an_exclusive_one_waits_for_them(tmp_path: Path) -> None:
    order: list[str] = []
    first, second = Holder(tmp_path, "shared-1", False, order), Holder(tmp_path, "shared-2", False, order)
    first.start()
    second.start()
    assert first.holding.wait(10) and second.holding.wait(10), "two shared holders must not block each other"
    alone = Holder(tmp_path, "exclusive", True, order)
    alone.start()
    assert not alone.holding.wait(PAUSE_S), "the exclusive holder ran beside shared ones"
    first.release.set()
    assert not alone.holding.wait(PAUSE_S), "the exclusive holder ran beside a shared one"
    second.release.set()
    assert alone.holding.wait(10)
    alone.release.set()
    alone.join(10)
    assert order == ["shared-1", "shared-2", "exclusive"] or order == ["shared-2", "shared-1", "exclusive"]


def test_a_waiting_exclusive_holder_goes_before_shared_holders_that_come_later(tmp_path: Path) -> None:
    order: list[str] = []
    running = Holder(tmp_path, "shared-running", False, order)
    running.start()
    assert running.holding.wait(10)
    alone = Holder(tmp_path, "exclusive", True, order)
    alone.start()
    assert not alone.holding.wait(PAUSE_S)
    later = Holder(tmp_path, "shared-later", False, order)
    later.start()
    assert not later.holding.wait(PAUSE_S), "a shared holder overtook the waiting exclusive one"
    running.release.set()
    assert alone.holding.wait(10)
    assert not later.holding.wait(PAUSE_S), "a shared holder ran beside the exclusive one"
    alone.release.set()
    assert later.holding.wait(10)
    later.release.set()
    for holder in (running, alone, later):
        holder.join(10)
    assert order == ["shared-running", "exclusive", "shared-later"]


def test_a_lock_ends_with_its_holder_even_when_the_body_raises(tmp_path: Path) -> None:
    try:
        with machine_share(tmp_path, exclusive=True):
            raise RuntimeError("the test failed")
    except RuntimeError:
        pass
    order: list[str] = []
    after = Holder(tmp_path, "shared", False, order)
    after.start()
    assert after.holding.wait(10), "the exclusive lock outlived the test that held it"
    after.release.set()
    after.join(10)
