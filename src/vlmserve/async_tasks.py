"""Small asyncio helpers shared by background loops (bench samplers, the gateway watchdog, the sim engine loop)."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Stop a background task and wait until it has really stopped (no task left pending at shutdown)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # the caller itself is being cancelled (Ctrl-C):
            raise  # swallowing that would let the run go on as if nothing had been asked
