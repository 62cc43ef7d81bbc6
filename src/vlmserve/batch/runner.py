"""Run a batch job: stream the input, send with bounded concurrency, append each result.

Guarantees, and how they are kept:
- nothing lost: each result is one unbuffered `write` of a whole line, made only after the
  full response arrived; a killed run leaves at most a partial last line, which the next
  run cuts off (`scan.drop_partial_tail`) and sends again;
- one writer: the output's lock (`lock.output_lock`) is held from the resume scan to the
  last fsync, so two runs never interleave and each custom_id is answered exactly once;
- a write that fails (disk full, read-only, I/O error) is cut back to the last complete
  line at once, the job stops (requests in flight are abandoned, unwritten) and the
  command ends with one line; the rerun resumes, sending only what has no line yet;
- resumable: the next run skips every line whose result is already in the output;
- flat memory: lines are read one at a time; only 8-byte hashes of done ids are kept;
- clean stop: the first Ctrl-C (or SIGTERM) stops taking lines and lets requests in flight
  finish; a second one abandons them without writing anything for them.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vlmserve.batch.lines import BatchRequest, MalformedLine
from vlmserve.batch.lock import output_lock
from vlmserve.batch.output import BatchOutcome, Result, ResultFile
from vlmserve.batch.scan import InputScan, PriorResults, entry_key, iter_input, scan_input, scan_output
from vlmserve.batch.send import NoAnswer, RetryPolicy, send_with_retries
from vlmserve.errors import UserError

NO_ANSWER_STREAK_LIMIT_FACTOR = 2
"""Stop the job after this many x concurrency consecutive requests got no answer at all."""


@dataclass
class BatchOptions:
    input_path: Path
    output_path: Path
    base_url: str
    concurrency: int = 16
    priority: str | None = None
    api_key: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    request_timeout_s: float = 600.0
    progress: bool = True


def api_root(base_url: str) -> str:
    """The server root: input urls already start with /v1, so a trailing /v1 is dropped."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def request_headers(options: BatchOptions) -> dict[str, str]:
    headers = {}
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    if options.priority:
        headers["X-Priority"] = options.priority
    return headers


class _Job:
    """One run over the input; state shared by the reader and the request tasks."""

    def __init__(self, options: BatchOptions, prior: PriorResults, outcome: BatchOutcome, console: Console) -> None:
        self.options = options
        self.prior = prior
        self.console = console
        self.outcome = outcome
        self.to_do = outcome.remaining
        self.headers = request_headers(options)
        self.root = api_root(options.base_url)
        self.slots = asyncio.Semaphore(options.concurrency)
        self.in_flight: set[asyncio.Task] = set()
        self.stopping = False
        self.no_answer_streak = 0
        self.started = time.monotonic()
        self.file: ResultFile | None = None
        self.progress: Progress | None = None
        self.task_id: TaskID | None = None

    # --- stopping ---
    def on_signal(self) -> None:
        if not self.stopping:
            self.stop("interrupted")
            self.console.print(
                f"[yellow]stopping: letting {len(self.in_flight)} requests in flight finish "
                "(press Ctrl-C again to abandon them)[/]"
            )
            return
        for task in list(self.in_flight):
            task.cancel()

    def stop(self, reason: str) -> None:
        self.stopping = True
        if self.outcome.stop_reason is None:
            self.outcome.stop_reason = reason
        self.outcome.interrupted = reason == "interrupted"

    # --- output ---
    def _record(self, result: Result) -> None:
        """Append a result; a write the file refuses stops the job and abandons what is in flight."""
        assert self.file is not None
        written = self.file.write(result)
        if self.file.failed:
            self._write_failed()
        if not written:
            return
        if self.progress is not None and self.task_id is not None:
            outcome = self.outcome
            elapsed = max(time.monotonic() - self.started, 1e-6)
            self.progress.update(
                self.task_id, advance=1, tok_s=f"{outcome.run_completion_tokens / elapsed:,.0f}", failed=outcome.failed
            )

    def _write_failed(self) -> None:
        if self.stopping and self.outcome.stop_reason == self.outcome.write_error:
            return
        assert self.outcome.write_error is not None
        self.stop(self.outcome.write_error)
        self.outcome.stop_reason = self.outcome.write_error
        current = asyncio.current_task()
        for task in list(self.in_flight):
            if task is not current:
                task.cancel()

    # --- work ---
    async def _send(self, session: aiohttp.ClientSession, request: BatchRequest) -> None:
        try:
            answer = await send_with_retries(session, self.root + request.url, request.body, self.headers, self.options.retry)
        except NoAnswer as err:
            self.outcome.no_answer += 1
            self.no_answer_streak += 1
            if self.no_answer_streak >= NO_ANSWER_STREAK_LIMIT_FACTOR * self.options.concurrency and not self.stopping:
                self.stop(f"the endpoint stopped answering ({err})")
            return
        finally:
            self.slots.release()
        self.no_answer_streak = 0
        self.outcome.retries += answer.retries
        self._record(Result.answered(request.custom_id, answer.status_code, answer.request_id, answer.body))

    async def run(self) -> BatchOutcome:
        timeout = aiohttp.ClientTimeout(total=self.options.request_timeout_s)
        connector = aiohttp.TCPConnector(limit=self.options.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            seen = 0
            for _, entry in iter_input(self.options.input_path):
                seen += 1
                if seen % 1000 == 0:
                    await asyncio.sleep(0)  # let signals and finished requests through
                if self.stopping:
                    break
                if entry_key(entry) in self.prior.done:
                    continue
                if isinstance(entry, MalformedLine):
                    self._record(Result.malformed(entry))
                    continue
                await self.slots.acquire()
                if self.stopping:
                    self.slots.release()
                    break
                task = asyncio.create_task(self._send(session, entry))
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)
            while self.in_flight:
                await asyncio.wait(set(self.in_flight))
        self.outcome.elapsed_s = time.monotonic() - self.started
        return self.outcome

    async def run_with_signals(self) -> BatchOutcome:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.on_signal)
        self.file = ResultFile(self.options.output_path, self.outcome)
        try:
            with progress_bar(self.console, self.options.progress) as progress:
                self.progress = progress
                self.task_id = progress.add_task("batch", total=self.to_do, tok_s="0", failed=0)
                return await self.run()
        finally:
            self.file.close()
            if self.file.failed and self.outcome.stop_reason != self.outcome.write_error:
                self.stop(self.outcome.write_error or "")
                self.outcome.stop_reason = self.outcome.write_error
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)


async def preflight(options: BatchOptions) -> None:
    """Refuse to start against an endpoint that is down or rejects our key: nothing is sent."""
    url = api_root(options.base_url) + "/v1/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            async with session.get(url, headers=request_headers(options)) as response:
                status = response.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        raise UserError(
            f"cannot reach {options.base_url} ({type(err).__name__}); start the server or fix --base-url (nothing was sent)"
        ) from None
    if status in (401, 403):
        raise UserError(f"{options.base_url} refused the API key (HTTP {status}); pass a valid --api-key")


def check_paths(options: BatchOptions) -> None:
    if options.input_path.resolve() == options.output_path.resolve():
        raise UserError("--output must differ from the input file")
    if not options.output_path.parent.is_dir():
        raise UserError(f"--output: folder {options.output_path.parent} does not exist; create it first")
    if options.base_url and not options.base_url.startswith(("http://", "https://")):
        raise UserError(f"--base-url '{options.base_url}' must start with http:// or https://")


def progress_bar(console: Console, enabled: bool) -> Progress:
    """Lines done, completion tokens/s, failures, time left (one look for both runners)."""
    return Progress(
        TextColumn("batch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tok_s]} tok/s · {task.fields[failed]} failed"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


@contextmanager
def prepared_job(options: BatchOptions, console: Console) -> Iterator[tuple[PriorResults, InputScan, BatchOutcome]]:
    """Check the paths, take the output's lock and read what is already done (both runners).

    The lock is held until the block ends, so the scan and every write of the run are one
    writer's.
    """
    check_paths(options)
    with output_lock(options.output_path):
        prior = scan_output(options.output_path)
        scan = scan_input(options.input_path, prior.done)
        if scan.already_done:
            console.print(f"resuming: {scan.already_done} of {scan.entries} lines already answered in {options.output_path}")
        yield prior, scan, BatchOutcome.resuming(scan, prior)


def run_batch_job(options: BatchOptions, console: Console) -> BatchOutcome:
    """Check, scan, and run the job to completion or to a clean stop."""
    with prepared_job(options, console) as (prior, scan, outcome):
        if outcome.remaining == 0:
            return outcome
        if scan.requests > 0:
            asyncio.run(preflight(options))
        return asyncio.run(_Job(options, prior, outcome, console).run_with_signals())
