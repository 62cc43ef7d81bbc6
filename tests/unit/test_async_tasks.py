"""cancel_and_wait stops a background task, and never swallows its caller's own cancellation (a
swallowed Ctrl-C let a tune go on to the next candidate)."""

from __future__ import annotations

import asyncio

import pytest

from vlmserve.async_tasks import cancel_and_wait


async def test_it_stops_the_task_and_returns() -> None:
    task = asyncio.create_task(asyncio.sleep(60))
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_the_callers_own_cancellation_goes_on() -> None:
    stubborn_started = asyncio.Event()

    async def stubborn() -> None:  # takes a while to stop, so the caller is cancelled while it waits
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stubborn_started.set()
            await asyncio.sleep(0.2)
            raise

    async def caller() -> str:
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0.01)  # let it start, so it has a clean-up to run when cancelled
        await cancel_and_wait(task)
        return "went on"

    outer = asyncio.create_task(caller())
    await asyncio.wait_for(stubborn_started.wait(), timeout=5)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
