"""`vlmserve batch --runner ray`: the same job, with the HTTP clients spread over a Ray cluster.

The driver (this process) keeps every promise that touches the output, exactly as the
built-in runner does and with the same code (`runner.prepared_job`, `output.ResultFile`):
it holds the output's lock, reads what is already answered, writes malformed lines itself,
and is the only writer. Ray Data does the sending: the lines still to send go into the
object store in chunks, a pool of `RaySender` actors POSTs them (each with its share of
`--concurrency`), and the driver appends each result as its batch streams back.

What differs from the built-in runner is what a stop costs (docs/batch.md, "Two runners"):
results that Ray holds but the driver has not yet written are dropped when the driver stops
or dies, so a rerun sends those requests again; the output still holds each custom_id once.
A result that reaches the driver twice (Ray retrying a batch whose actor died) is written
once: the driver remembers the ids it wrote in this run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Protocol

from rich.console import Console

from vlmserve.batch.lines import MalformedLine
from vlmserve.batch.output import BatchOutcome, Result, ResultFile, error_line
from vlmserve.batch.ray_engine import ENGINE_URL, UNSUPPORTED, engine_processor
from vlmserve.batch.ray_sender import RaySender, request_row
from vlmserve.batch.runner import (
    NO_ANSWER_STREAK_LIMIT_FACTOR,
    BatchOptions,
    api_root,
    preflight,
    prepared_job,
    progress_bar,
    request_headers,
)
from vlmserve.batch.scan import PriorResults, entry_key, id_key, iter_input
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject

RAY_EXTRA = "pip install 'vlmserve[ray]'"
ACTOR_CPUS = 0.5
"""CPUs each sender actor reserves: an HTTP client waits far more than it computes, but it must
reserve something so that Ray spreads the actors over the cluster's nodes."""
ENGINE_CPUS = 1.0
"""CPUs each engine's placement bundle takes on a cluster without GPUs (vLLM's CPU build)."""
CHUNK_ROWS = 500
"""Rows per block put into the object store: small enough that every actor gets work early."""
CONNECT_TIMEOUT_ENV = "VLMSERVE_RAY_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_WORKERS = 2


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None
    """None: $RAY_ADDRESS if set, else a private local Ray instance for this job."""
    workers: int = DEFAULT_WORKERS
    engine: str | None = None
    """A model (path or hub id): Ray starts `workers` vLLM engines for it instead of sending to an endpoint."""
    engine_kwargs: JSONObject = field(default_factory=dict)


def resolve_address(flag: str | None, env: Mapping[str, str]) -> str:
    """--ray-address, else $RAY_ADDRESS, else 'local' (a new instance, never whichever cluster
    was started last on this machine, which is what Ray's own default would join)."""
    return flag or env.get("RAY_ADDRESS") or "local"


def per_actor_concurrency(concurrency: int, workers: int) -> int:
    """Each actor's share of --concurrency (rounded up, so the total is never below it)."""
    return max(1, math.ceil(concurrency / workers))


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a concrete address ('10.0.0.5:6379', 'ray://head:10001'); None for 'local'/'auto'."""
    if address in ("local", "auto"):
        return None
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"--ray-address '{address}': give HOST:PORT of the Ray head (e.g. 127.0.0.1:6379), ray://HOST:PORT, auto or local"
        )
    return host.strip("[]"), int(port)


def import_ray() -> ModuleType:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise UserError(f"--runner ray needs Ray Data, which is not installed: {RAY_EXTRA}") from None
    return ray


def _connect(ray: ModuleType, address: str, workers: int, cpus_per_worker: float) -> None:
    """Join the cluster (or start a local instance) within a bounded time; one line if not."""
    target = host_port(address)
    if target is not None:
        try:
            socket.create_connection(target, timeout=5).close()
        except OSError as err:
            raise UserError(
                f"cannot reach the Ray cluster at {address} ({err.strerror or type(err).__name__}); "
                "start it (ray start --head) or fix --ray-address / RAY_ADDRESS (nothing was sent)"
            ) from None
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # Ray's C++ warnings would bury the summary
    kwargs: dict[str, object] = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
    if address == "local":
        kwargs |= {"num_cpus": max(os.cpu_count() or 1, math.ceil(workers * cpus_per_worker)), "include_dashboard": False}
    with _quiet_stderr() as stderr_fd:
        if address == "local":
            # in this thread: Ray ties the processes it starts to the life of the thread that started them
            ray.init(address=address, **kwargs)
        else:
            _join_within_timeout(ray, address, kwargs, stderr_fd)
    needed = workers * cpus_per_worker
    cpus = float(ray.cluster_resources().get("CPU", 0))
    if cpus < needed:
        raise UserError(
            f"the Ray cluster at {address} has {cpus:g} CPUs; --ray-workers {workers} needs {needed:g} "
            f"({cpus_per_worker:g} per worker); lower --ray-workers"
        )


@contextmanager
def _quiet_stderr() -> Iterator[int]:
    """Ray's C++ core prints to file descriptor 2 while it starts (log-level notices, retries); the
    user sees the summary or one error line instead. Errors still arrive as exceptions. Yields a
    descriptor of the real stderr."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield saved
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _auth_hint() -> str:
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return ""
    return (
        "; if the cluster uses token authentication (Ray's default), set RAY_AUTH_MODE=token and "
        "RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN)"
    )


def _join_within_timeout(ray: ModuleType, address: str, kwargs: dict[str, object], stderr_fd: int) -> None:
    """ray.init against something that is not a Ray head (or refuses our token) retries for ever.

    After the bound the error is written and the process ends at once: the connecting thread
    cannot be stopped, and until the process exits it would keep printing retries. Nothing needs
    cleaning up yet (the output is not open; the kernel drops the output's lock).
    """
    timeout_s = float(os.environ.get(CONNECT_TIMEOUT_ENV) or DEFAULT_CONNECT_TIMEOUT_S)
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as err:  # noqa: BLE001 - reported below as one line
            failure.append(err)

    thread = threading.Thread(target=connect, name="ray-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        message = (
            f"error: {address} did not answer as a Ray cluster within {timeout_s:g} s; give the Ray head's "
            f"GCS address (ray start --head prints it) in --ray-address{_auth_hint()} (nothing was sent)\n"
        )
        os.write(stderr_fd, message.encode())
        os._exit(2)
    if failure:
        first = str(failure[0]).strip().splitlines()
        raise UserError(
            f"cannot join the Ray cluster at {address}: {first[0] if first else type(failure[0]).__name__}"
            f"{_auth_hint()} (nothing was sent)"
        )


@contextmanager
def _ray_session(address: str, workers: int, cpus_per_worker: float) -> Iterator[ModuleType]:
    ray = import_ray()
    try:
        _connect(ray, address, workers, cpus_per_worker)
        data_context = ray.data.DataContext.get_current()
        data_context.enable_progress_bars = False
        data_context.print_on_execution_start = False
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
        yield ray
    finally:
        if ray.is_initialized():
            ray.shutdown()


class _Stop:
    """First Ctrl-C/SIGTERM: stop after the batch arriving now; second: stop at once."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.requested = False
        self.previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def __enter__(self) -> _Stop:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.console.print(
            "[yellow]stopping: writing the results arriving now; results Ray still holds are "
            "dropped and sent again on rerun (press Ctrl-C again to stop at once)[/]"
        )


def _requests_to_send(options: BatchOptions, prior: PriorResults, only_url: str | None) -> int:
    """Sendable lines with no result yet: when there are none, Ray is not started at all."""
    return sum(
        1
        for _, entry in iter_input(options.input_path)
        if not isinstance(entry, MalformedLine)
        and entry_key(entry) not in prior.done
        and (only_url is None or entry.url == only_url)
    )


def _feed(
    options: BatchOptions,
    prior: PriorResults,
    file: ResultFile,
    put: Callable[[list[dict[str, str]]], ObjectRef] | None,
    only_url: str | None = None,
) -> list[ObjectRef]:
    """Write the malformed lines not yet answered (and, with `only_url`, an error record for each
    line of another url), and `put` the lines still to send into the object store in chunks of
    CHUNK_ROWS rows (their references are returned)."""
    refs: list[ObjectRef] = []
    chunk: list[dict[str, str]] = []
    for _, entry in iter_input(options.input_path):
        if entry_key(entry) in prior.done:
            continue
        if isinstance(entry, MalformedLine):
            if not file.write(Result.malformed(entry)):
                return []
            continue
        if only_url is not None and entry.url != only_url:
            message = f"line {entry.line_no}: --ray-engine answers {only_url} lines only; this one is {entry.url}"
            if not file.write(Result(error_line(entry.custom_id, UNSUPPORTED, message, entry.line_no), UNSUPPORTED)):
                return []
            continue
        if put is None:
            continue
        chunk.append(request_row(entry.custom_id, entry.url, entry.body))
        if len(chunk) >= CHUNK_ROWS:
            refs.append(put(chunk))
            chunk = []
    if chunk and put is not None:
        refs.append(put(chunk))
    return refs


def _putter(ray: ModuleType) -> Callable[[list[dict[str, str]]], ObjectRef]:
    import pyarrow as pa  # part of ray[data]

    def put(rows: list[dict[str, str]]) -> ObjectRef:
        return ray.put(pa.Table.from_pylist(rows))

    return put


class _Collector:
    """The driver's side of the stream: write each result once, count, watch for a dead endpoint."""

    def __init__(self, options: BatchOptions, ray_options: RayOptions, outcome: BatchOutcome, file: ResultFile) -> None:
        self.outcome = outcome
        self.file = file
        self.written: set[int] = set()
        self.no_answer_streak = 0
        self.streak_limit = NO_ANSWER_STREAK_LIMIT_FACTOR * max(options.concurrency, ray_options.workers)
        self.duplicates = 0

    def take(self, batch: Mapping[str, Sequence[object]]) -> str | None:
        """Write one batch of results; a reason to stop the job, or None."""
        for custom_id, line, cause, prompt, completion, retries, no_answer in zip(
            batch["custom_id"],
            batch["line"],
            batch["cause"],
            batch["prompt_tokens"],
            batch["completion_tokens"],
            batch["retries"],
            batch["no_answer"],
        ):
            key = id_key(str(custom_id))
            if key in self.written:
                self.duplicates += 1
                continue
            if no_answer:
                self.outcome.no_answer += 1
                self.no_answer_streak += 1
                if self.no_answer_streak >= self.streak_limit:
                    return f"the endpoint stopped answering ({no_answer})"
                continue
            self.no_answer_streak = 0
            self.outcome.retries += int(retries)
            if not self.file.write(Result(bytes(line), str(cause) or None, int(prompt), int(completion))):
                return self.outcome.write_error
            self.written.add(key)
            if self.file.failed:
                return self.outcome.write_error
        return None


def _stream(
    ray: ModuleType,
    refs: list[ObjectRef],
    options: BatchOptions,
    ray_options: RayOptions,
    collector: _Collector,
    stop: _Stop,
    on_batch: Callable[[], None],
) -> None:
    per_actor = per_actor_concurrency(options.concurrency, ray_options.workers)
    dataset = ray.data.from_arrow_refs(refs)
    if ray_options.engine is not None:
        processor = engine_processor(ray, ray_options.engine, ray_options.workers, ray_options.engine_kwargs, per_actor)
        _consume(processor(dataset), collector, stop, on_batch)
        return
    dataset = dataset.map_batches(
        RaySender,
        batch_size=per_actor,
        batch_format="numpy",
        num_cpus=ACTOR_CPUS,
        compute=ray.data.ActorPoolStrategy(size=ray_options.workers),
        fn_constructor_kwargs={
            "root": api_root(options.base_url),
            "headers": request_headers(options),
            "concurrency": per_actor,
            "request_timeout_s": options.request_timeout_s,
            "retry": options.retry,
        },
    )
    _consume(dataset, collector, stop, on_batch)


class _Batches(Protocol):
    """What `_consume` reads from a Ray dataset: its batches, one column array per field."""

    def iter_batches(
        self, *, batch_size: int | None, batch_format: str, prefetch_batches: int
    ) -> Iterator[Mapping[str, Sequence[object]]]: ...


ObjectRef = object
"""A Ray object reference: only handed back to Ray (`from_arrow_refs`), never read here."""


def _consume(dataset: _Batches, collector: _Collector, stop: _Stop, on_batch: Callable[[], None]) -> None:
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
        reason = collector.take(batch)
        on_batch()
        if reason is not None:
            collector.outcome.stop_reason = reason
            return
        if stop.requested:
            collector.outcome.stop_reason = "interrupted"
            collector.outcome.interrupted = True
            return


def run_ray_job(options: BatchOptions, ray_options: RayOptions, console: Console) -> BatchOutcome:
    """The job through Ray Data; same checks, output and outcome as `runner.run_batch_job`."""
    import_ray()  # a missing extra is reported before anything else is touched
    address = resolve_address(ray_options.address, os.environ)
    host_port(address)  # and a malformed address
    with prepared_job(options, console) as (prior, scan, outcome):
        if outcome.remaining == 0:
            return outcome
        only_url = ENGINE_URL if ray_options.engine is not None else None
        if scan.requests > 0 and only_url is None:
            asyncio.run(preflight(options))
        started = time.monotonic()
        cpus_per_worker = ENGINE_CPUS if only_url is not None else ACTOR_CPUS
        with ExitStack() as stack:
            ray = (
                stack.enter_context(_ray_session(address, ray_options.workers, cpus_per_worker))
                if _requests_to_send(options, prior, only_url)
                else None
            )
            file = ResultFile(options.output_path, outcome)
            stack.callback(file.close)
            stop = stack.enter_context(_Stop(console))
            progress = stack.enter_context(progress_bar(console, options.progress))
            task_id = progress.add_task("batch", total=outcome.remaining, tok_s="0", failed=0)

            def on_batch() -> None:
                elapsed = max(time.monotonic() - started, 1e-6)
                progress.update(
                    task_id,
                    completed=outcome.answered_now,
                    tok_s=f"{outcome.run_completion_tokens / elapsed:,.0f}",
                    failed=outcome.failed,
                )

            refs = _feed(options, prior, file, None if ray is None else _putter(ray), only_url)
            on_batch()
            if refs and ray is not None and not file.failed:  # refs exist only when a session puts them
                try:
                    _stream(ray, refs, options, ray_options, _Collector(options, ray_options, outcome, file), stop, on_batch)
                except KeyboardInterrupt:
                    outcome.stop_reason, outcome.interrupted = "interrupted", True
        if outcome.write_error:
            outcome.stop_reason = outcome.write_error
        outcome.elapsed_s = time.monotonic() - started
        return outcome
