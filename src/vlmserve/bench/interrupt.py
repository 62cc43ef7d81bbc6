"""Ctrl-C during a bench: stop sending, keep every record, and still write the results.

The first Ctrl-C stops new sends and gives requests in flight a grace period; a second
one cancels them (they are recorded as `interrupted`). Outside the load phase Ctrl-C
keeps its usual meaning (the command stops with "interrupted", exit 130).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console

GRACE_S = 10.0
"""After the first Ctrl-C, how long requests in flight may take to finish."""

STOP_SENDING, STOP_NOW = 1, 2
"""Interrupt levels: the first Ctrl-C stops new sends, the second cancels what is in flight."""


class Interrupt:
    """Ctrl-C as the load loops see it, so a stopped run keeps every record it has.

    Level 1 (`STOP_SENDING`): no new request is sent; requests in flight get a grace period
    to finish. Level 2 (`STOP_NOW`): requests still in flight are cancelled and recorded as
    `interrupted`. Listeners (the worker processes' shared flag) hear every change.
    """

    def __init__(self) -> None:
        self.level = 0
        self._stopping: asyncio.Event | None = None
        self._now: asyncio.Event | None = None
        self._listeners: list[Callable[[int], None]] = []

    @property
    def stopping(self) -> asyncio.Event:
        if self._stopping is None:  # created lazily, inside the loop that waits on it
            self._stopping = asyncio.Event()
            if self.level >= STOP_SENDING:
                self._stopping.set()
        return self._stopping

    @property
    def now(self) -> asyncio.Event:
        if self._now is None:
            self._now = asyncio.Event()
            if self.level >= STOP_NOW:
                self._now.set()
        return self._now

    def listen(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def raise_to(self, level: int) -> None:
        if level <= self.level:
            return
        self.level = level
        if level >= STOP_SENDING:
            self.stopping.set()
        if level >= STOP_NOW:
            self.now.set()
        for listener in self._listeners:
            listener(level)

    def escalate(self) -> int:
        """One more Ctrl-C; returns the new level."""
        self.raise_to(min(self.level + 1, STOP_NOW))
        return self.level


@contextmanager
def ctrl_c_stops_load(interrupt: Interrupt, console: Console, grace_s: float) -> Iterator[None]:
    """While the load runs, Ctrl-C raises `interrupt` instead of killing the command."""
    loop = asyncio.get_running_loop()

    def on_ctrl_c() -> None:
        if interrupt.escalate() == STOP_SENDING:
            console.print(
                f"[yellow]Ctrl-C: no new requests; those in flight get up to {grace_s:g} s "
                "(Ctrl-C again to stop now). Every record is kept.[/yellow]"
            )
        else:
            console.print("[yellow]Ctrl-C again: cancelling the requests in flight.[/yellow]")

    try:
        loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    except (NotImplementedError, RuntimeError, ValueError):  # no signal support here (not the main thread)
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
