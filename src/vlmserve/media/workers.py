"""Image work off the event loop: a small pool of worker processes, with a time budget per request.

Why processes, not threads: Pillow releases the GIL in its C decoders only in parts (a PNG's
zlib inflate and filters do, the mode conversion and the Python between them do not), so 16
downscales of a 1-bit 8000x8000 PNG run in threads still kept /health waiting; a thread can
also not be stopped, so a budget could only be noticed after the work was done. A process can
be killed: the budget holds however long the decoder would have run (benchmarks/image_preflight.py
--compare-pools measures the event loop's lag with both).

The rules kept:
- At most `workers` processes, started with the gateway (spawned: a fresh interpreter, nothing
  inherited from the event loop), each doing one image at a time, at a lower CPU priority than the
  gateway itself (niceness +10): where cores are short, the event loop is scheduled first.
- A request's images share one budget: `budget_s` of CPU time in the workers, for the whole
  request (a worker's own start is not counted; CPU, not wall time, so a busy machine does not
  turn images into refusals; wall time is capped too, at WALL_FACTOR times the budget). An image
  still in a worker past its request's budget has its worker killed (a fresh one is started in
  its place at once) and the request is refused with 400 (`ImageWorkRefused`).
- A request waits for a free worker at most `budget_s`, and at most `workers * QUEUE_PER_WORKER`
  requests wait at once: beyond either, 503 with Retry-After (the pool never grows).
- The bytes travel over a pipe; the event loop only awaits a future (a dedicated thread per
  worker waits on the pipe).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import TypeVar

QUEUE_PER_WORKER = 8  # requests that may wait for a busy pool, per worker process
WORKER_NICENESS = 10  # below the event loop's process: with fewer free cores than workers, /health still wins the CPU
START_TIMEOUT_S = 60.0
WALL_FACTOR = 4.0  # an image may take this many times its CPU budget in wall time (a starved worker)
_CHECK_S = 0.02  # how often a waiting thread reads its worker's CPU time  # a worker process that has not imported its decoders by then is given up
DEFAULT_WORKERS = 2
DEFAULT_BUDGET_S = 5.0


class ImageWorkRefused(Exception):
    """Image work the pool would not or could not do; carries the HTTP status and OpenAI error code."""

    def __init__(
        self, message: str, status: int = 400, code: str = "image_work_over_budget", retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WorkBudget:
    """What is left of one request's image-work budget, in seconds of worker CPU time."""

    __slots__ = ("remaining_s",)

    def __init__(self, seconds: float) -> None:
        self.remaining_s = seconds


class _WorkerNotStarted(Exception):
    """The worker process did not come up (START_TIMEOUT_S)."""


class _WorkerFailed(Exception):
    """The task raised inside the worker (a corrupt image past its header, memory): its one-line reason."""


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """A worker process: run each (function, args) received, send back (True, result) or (False, reason)."""
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the gateway, which stops the pool
    os.nice(WORKER_NICENESS)
    import PIL.Image  # noqa: F401 -- imported before "ready": a request's budget never pays for it

    conn.send("ready")
    while True:
        try:
            function, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, object] = (True, function(*args))
        except MemoryError:
            reply = (False, "not enough memory to decode it")
        except Exception as err:  # a decoder's error: the request's, reported as a 400
            reply = (False, " ".join(f"{type(err).__name__}: {err}".split())[:200])
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


Result = TypeVar("Result")
"""What a function run in a worker returns (sent back through the pipe, so picklable)."""


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, context: SpawnContext) -> None:
        self.conn, child = context.Pipe()
        self.process: SpawnProcess = context.Process(target=_serve, args=(child,), daemon=True, name="vlmserve-image-worker")
        self.process.start()
        child.close()
        self.ready = False

    def cpu_s(self) -> float:
        """CPU time the worker process has used (user + system), from /proc where there is one."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return 0.0  # no /proc (or the worker is gone): the wall-time cap still holds

    def call(self, function: Callable[..., Result], args: tuple[object, ...], budget_s: float) -> tuple[Result, float]:
        """Run in a pool thread: send the task and wait while it uses at most budget_s of CPU (and
        WALL_FACTOR times that of wall time) once the worker is up. (result, CPU seconds it took);
        TimeoutError past the budget."""
        if not self.ready:
            if not self.conn.poll(START_TIMEOUT_S):
                raise _WorkerNotStarted
            self.conn.recv()
            self.ready = True
        cpu_at_start = self.cpu_s()
        wall_deadline = time.monotonic() + budget_s * WALL_FACTOR
        self.conn.send((function, args))
        while not self.conn.poll(_CHECK_S):
            if self.cpu_s() - cpu_at_start > budget_s or time.monotonic() > wall_deadline:
                raise TimeoutError
        ok, value = self.conn.recv()
        if not ok:
            raise _WorkerFailed(value)
        return value, self.cpu_s() - cpu_at_start

    def kill(self) -> None:
        """SIGKILL now (cheap: the event loop may call it); `reap` waits for the exit."""
        if self.process.exitcode is None:
            self.process.kill()

    def reap(self) -> None:
        """Wait for the killed process and close the pipe (in a thread: a large process takes a while to exit)."""
        self.process.join(5)
        self.conn.close()


class ImageWorkerPool:
    """Runs picklable functions of image bytes in `workers` processes (module docstring)."""

    def __init__(self, workers: int = DEFAULT_WORKERS, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.workers = workers
        self.budget_s = budget_s
        self.queue_limit = workers * QUEUE_PER_WORKER
        self._context = multiprocessing.get_context("spawn")
        self._idle: list[_Worker] = []
        self._busy = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="vlmserve-image-wait")
        self.killed = 0  # workers killed over a budget (or lost), for tests and metrics
        self._closed = False

    def start(self) -> None:
        """Start the processes now, so the first image does not wait for an interpreter to start."""
        while len(self._idle) + self._busy < self.workers:
            self._idle.append(_Worker(self._context))

    def close(self) -> None:
        self._closed = True
        for worker in self._idle:
            worker.kill()
            worker.reap()
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def budget(self) -> WorkBudget:
        """A request's budget, shared by its images."""
        return WorkBudget(self.budget_s)

    async def run(self, function: Callable[..., Result], args: tuple[object, ...], budget: WorkBudget, what: str) -> Result:
        """function(*args) in a worker, within what is left of the request's `budget`; ImageWorkRefused
        otherwise. `what` names the work in a refusal ("image 3")."""
        if budget.remaining_s <= 0:
            raise self._over_budget(what)
        await self._acquire(what)
        worker: _Worker | None = None
        try:
            worker = self._idle.pop() if self._idle else _Worker(self._context)
            loop = asyncio.get_running_loop()
            try:
                result, took_s = await loop.run_in_executor(self._threads, worker.call, function, args, budget.remaining_s)
            except TimeoutError:
                budget.remaining_s = 0.0
                raise self._over_budget(what) from None
            except _WorkerNotStarted:
                raise ImageWorkRefused(
                    f"{what}: no image worker process could be started within {START_TIMEOUT_S:g} s: retry shortly",
                    status=503,
                    code="image_workers_busy",
                    retry_after_s=1,
                ) from None
            except (EOFError, OSError):  # the worker died under the task (a decoder crashed, or the kernel's OOM killer)
                raise ImageWorkRefused(
                    f"{what}: its image worker process ended while decoding it: send a valid, smaller image", code="invalid_image"
                ) from None
            except _WorkerFailed as failed:
                self._idle.append(worker)
                worker = None
                raise ImageWorkRefused(
                    f"{what} could not be decoded ({failed}): send a valid image", code="invalid_image"
                ) from None
            budget.remaining_s -= took_s
            self._idle.append(worker)
            worker = None
            return result
        finally:
            if worker is not None:  # over budget, cancelled (the client left) or the worker died: never reused
                self.killed += 1
                worker.kill()  # also ends the wait of a thread still on it (the request was cancelled)
                self._threads.submit(worker.reap)
                if not self._closed:
                    self._idle.append(_Worker(self._context))  # starting now, ready before it is needed
            self._release()

    def _over_budget(self, what: str) -> ImageWorkRefused:
        return ImageWorkRefused(
            f"{what}: resizing this request's images took over its {self.budget_s:g} s CPU budget "
            "(--image-work-budget): send smaller images, or images at most the downscale size"
        )

    async def _acquire(self, what: str) -> None:
        if self._busy < self.workers and not self._waiting:
            self._busy += 1
            return
        if len(self._waiting) >= self.queue_limit:
            raise ImageWorkRefused(
                f"{what}: the gateway's image workers are busy ({self.queue_limit} requests waiting): retry shortly",
                status=503,
                code="image_workers_busy",
                retry_after_s=1,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(self.budget_s):
                await waiter  # _release hands its slot over (busy stays counted)
        except BaseException as err:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just as this request left: pass it on
            if isinstance(err, TimeoutError):
                raise ImageWorkRefused(
                    f"{what}: no image worker was free within {self.budget_s:g} s: retry shortly",
                    status=503,
                    code="image_workers_busy",
                    retry_after_s=1,
                ) from None
            raise
        finally:
            if waiter in self._waiting:
                self._waiting.remove(waiter)

    def _release(self) -> None:
        while self._waiting:
            waiter = self._waiting.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1
