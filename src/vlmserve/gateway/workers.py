"""`vlmserve gateway --workers N`: N gateway processes on one port, so the gateway uses many cores.

One Python process relays on one core. With N workers each process binds the same address with
SO_REUSEPORT and the kernel spreads new client connections across them; nothing is proxied
between processes. This process stays a small supervisor:
- it reserves the port first (so port 0 picks one port for all, and a port in use is a one-line
  error before any worker starts), then starts the workers and reports ready once all listen;
- a worker that dies is restarted (after a pause that grows if it keeps dying);
- SIGTERM or SIGINT is passed to every worker, each drains its own streams (serve_forever), and
  the supervisor exits once they have;
- /metrics sums counters and histograms over the workers (metrics.py, Prometheus multiprocess
  mode in a private temporary directory).

Everything a worker keeps in memory is per worker (limits, queues, breakers, routing state, health
checks, `--image-workers` processes): docs/gateway.md lists it. Every worker appends to the audit log.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import multiprocessing.process
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from typing import Any

from vlmserve.errors import UserError
from vlmserve.gateway.config import GatewayConfig

log = logging.getLogger("vlmserve.gateway")

MAX_WORKERS = 64
RESTART_PAUSE_S = (0.5, 10.0)  # first and longest pause before restarting a worker that died


def check_workers(value: int) -> int:
    """The --workers value, or a one-line error."""
    if not 1 <= value <= MAX_WORKERS:
        raise UserError(f"--workers must be between 1 and {MAX_WORKERS} (gateway processes sharing the port); got {value}")
    return value


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) host:port with SO_REUSEPORT: picks port 0's port for every worker and holds it."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise UserError("--workers needs SO_REUSEPORT, which this platform lacks; run one worker")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise listen_error(host, port, err) from None
    return sock


def listen_error(host: str, port: int, err: OSError) -> UserError:
    """Why the gateway cannot listen on host:port, as the one line a user sees."""
    if err.errno == errno.EADDRINUSE:
        return UserError(f"port {port} on {host} is already in use: choose another --port")
    return UserError(f"cannot listen on {host}:{port}: {err.strerror}")


def _worker_main(config: GatewayConfig, ready: Any) -> None:
    """A worker: the one-process gateway, listening with SO_REUSEPORT; tells the supervisor its pid."""
    from vlmserve.gateway.server import serve_forever

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s[{os.getpid()}]: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which sends SIGTERM
    try:
        serve_forever(config, on_ready=lambda _port: ready.put(os.getpid()), reuse_port=True)
    except UserError as err:
        ready.put(f"error: {err}")
        raise SystemExit(2) from None


class WorkerSupervisor:
    """Starts, watches and stops the worker processes."""

    def __init__(self, config: GatewayConfig, workers: int) -> None:
        self.config = config
        self.count = check_workers(workers)
        self.context = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited loop, metrics mode set
        self.ready = self.context.Queue()
        self.processes: list[SpawnProcess] = []
        self.deaths: list[int] = []  # per slot: deaths in a row, for the restart pause
        self.started_at: list[float] = []
        self.stopping = False

    def _start(self, slot: int) -> SpawnProcess:
        process = self.context.Process(
            target=_worker_main, args=(self.config, self.ready), name=f"vlmserve-gateway-{slot}", daemon=False
        )
        process.start()
        return process

    def run(self, on_ready: Callable[[int], None] | None = None, start_timeout_s: float = 120.0) -> None:
        """Serve until SIGTERM/SIGINT; return once every worker has drained and exited."""
        reservation = reserve_port(self.config.host, self.config.port)
        port = reservation.getsockname()[1]
        self.config.port = port
        metrics_dir = tempfile.mkdtemp(prefix="vlmserve-gateway-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # read by each worker's prometheus_client at import
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.deaths = [0] * self.count
            self.started_at = [time.monotonic()] * self.count
            self.processes = [self._start(slot) for slot in range(self.count)]
            self._wait_ready(start_timeout_s)
            if on_ready is not None and not self.stopping:
                on_ready(port)
            self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            reservation.close()
            shutil.rmtree(metrics_dir, ignore_errors=True)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = self.count
        while pending and not self.stopping:
            try:
                message = self.ready.get(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
            except Exception:  # queue.Empty
                if time.monotonic() > deadline:
                    raise UserError(f"gateway workers did not start within {timeout_s:.0f} s") from None
                dead = [p for p in self.processes if p.exitcode is not None]
                if dead:
                    raise UserError(f"a gateway worker exited with code {dead[0].exitcode} while starting; see its log above")
                continue
            if isinstance(message, str):
                raise UserError(message.removeprefix("error: "))
            pending -= 1

    def _watch(self) -> None:
        """Restart dead workers until asked to stop."""
        restart_at: dict[int, float] = {}
        while not self.stopping:
            time.sleep(0.1)
            self._drain_ready_queue()
            now = time.monotonic()
            for slot, process in enumerate(self.processes):
                if process.exitcode is None or self.stopping:
                    continue
                if slot not in restart_at:
                    if now - self.started_at[slot] > 60:
                        self.deaths[slot] = 0  # it had been up a while: restart quickly again
                    self.deaths[slot] += 1
                    pause = min(RESTART_PAUSE_S[1], RESTART_PAUSE_S[0] * 2 ** (self.deaths[slot] - 1))
                    log.warning(
                        "gateway worker %d (pid %s) exited with code %s; restarting it in %.1f s",
                        slot,
                        process.pid,
                        process.exitcode,
                        pause,
                    )
                    self._forget_metrics(process.pid)
                    restart_at[slot] = now + pause
                elif now >= restart_at[slot]:
                    del restart_at[slot]
                    self.started_at[slot] = now
                    self.processes[slot] = self._start(slot)

    def _drain_ready_queue(self) -> None:
        while True:
            try:
                self.ready.get_nowait()
            except Exception:  # queue.Empty: restarted workers report ready here
                return

    def _forget_metrics(self, pid: int | None) -> None:
        if pid is None:
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

    def _stop_all(self) -> None:
        """SIGTERM every worker (each drains its streams), then wait; kill what outlives the drain."""
        for process in self.processes:
            if process.exitcode is None and process.pid is not None:
                try:
                    os.kill(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.config.drain_timeout_s + 10
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join(5)
        self.ready.close()


def serve_workers(config: GatewayConfig, workers: int, on_ready: Callable[[int], None] | None = None) -> None:
    """The `vlmserve gateway --workers N` command (N > 1)."""
    WorkerSupervisor(config, workers).run(on_ready)
