"""First-token and idle-chunk timeouts for every upstream exchange, checked on one timer.

Rescheduling a timer per streamed chunk would cost a heap operation per chunk across hundreds
of streams; instead each exchange bumps a counter per chunk and one periodic task compares
counters, cancelling the task of any exchange that made no progress for too long.
"""

from __future__ import annotations

import asyncio

from vlmserve.async_tasks import cancel_and_wait

FIRST_TOKEN = "first_token"  # an exchange's phase until the client has its first bytes
IDLE_CHUNK = "idle_chunk"  # and after


class Exchange:
    """One attempt on one replica, as the watchdog sees it."""

    __slots__ = ("task", "limit_s", "progress_at", "chunks", "seen_chunks", "expired", "phase")

    def __init__(self, task: asyncio.Task, limit_s: float, now: float) -> None:
        self.task = task
        self.limit_s = limit_s
        self.progress_at = now
        self.chunks = 0
        self.seen_chunks = 0
        self.expired = False
        self.phase = FIRST_TOKEN

    def streaming(self, idle_limit_s: float, now: float) -> None:
        """The first byte arrived: from now on the idle-chunk limit applies."""
        self.phase = IDLE_CHUNK
        self.limit_s = idle_limit_s
        self.progress_at = now
        self.chunks += 1


class Watchdog:
    def __init__(self, tick_s: float = 0.25) -> None:
        self.tick_s = tick_s
        self.active: set[Exchange] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-watchdog")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick_s)
            now = loop.time()
            for exchange in list(self.active):
                chunks = exchange.chunks
                if chunks != exchange.seen_chunks:
                    exchange.seen_chunks = chunks
                    exchange.progress_at = now
                elif not exchange.expired and now - exchange.progress_at > exchange.limit_s:
                    exchange.expired = True
                    exchange.task.cancel()
