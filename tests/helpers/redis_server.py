"""A real `redis-server` (Debian package) on a free port, started and stopped by the test itself.

    with start_redis(tmp_path) as redis_server:
        client = redis_server.client()        # redis.Redis (sync), for looking at keys
        redis_server.kill()                   # SIGKILL: an outage as real as it gets
        redis_server.restart()                # same port, empty (no persistence)

The `redis_server` fixture gives one per test. Nothing is persisted (`--save ""`,
`--appendonly no`): a restart comes back empty, as a Redis pod without a volume does.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.procs import free_port, stop_process

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@dataclass
class RedisServer:
    """A redis-server process this test started; `url` is what `--state` takes."""

    directory: Path
    port: int
    password: str | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / f"redis-{self.port}.log"

    def start(self, timeout_s: float = 10.0) -> None:
        argv = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.log_path),
            "--protected-mode",
            "no",
        ]
        if self.password:
            argv += ["--requirepass", self.password]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self._log_tail()}")
            try:
                self.client().ping()
                return
            except Exception:  # noqa: BLE001 - not accepting connections yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server not ready in {timeout_s} s: {self._log_tail()}") from None
                time.sleep(0.05)

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=2, decode_responses=True)

    def kill(self) -> None:
        """SIGKILL: connections drop mid-call, nothing is flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, timeout_s=5.0)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return ""


@contextmanager
def start_redis(directory: Path, *, password: str | None = None, port: int | None = None) -> Iterator[RedisServer]:
    """Run redis-server until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    server = RedisServer(directory, port or free_port(), password)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh, empty Redis for one test."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    with start_redis(tmp_path / "redis") as server:
        yield server
