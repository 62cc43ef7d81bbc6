"""Start a real `vlmserve engine sim` in a subprocess on a free port, for any test that needs an engine.

    with start_sim_engine(model="m", ttft_ms=20, itl_ms=5) as engine:
        httpx.post(engine.base_url + "/v1/chat/completions", json=...)

Keyword options map onto CLI flags: `max_num_seqs=4` → `--max-num-seqs 4`, `True` → a bare
flag (`no_prefix_caching=True`), lists repeat the flag, `None` is left out. The engine runs
in its own process so that killing it (or an injected crash) is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.procs import free_port, stop_process, wait_http_ok


def sim_engine_argv(port: int, **options: Any) -> list[str]:
    """argv for `python -m vlmserve engine sim` with `options` as flags."""
    argv = [sys.executable, "-m", "vlmserve", "engine", "sim", "--host", "127.0.0.1", "--port", str(port)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            if name in ("error_codes", "image_budgets"):
                argv += [flag, ",".join(str(item) for item in value)]
            else:
                for item in value:
                    argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


@dataclass
class SimHandle:
    """A running sim engine process."""

    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def metrics_text(self) -> str:
        return httpx.get(f"{self.base_url}/metrics", timeout=10).text

    def kill(self) -> None:
        """SIGKILL: the engine dies as in a real crash."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 10 s."""
        stop_process(self.process, timeout_s=10.0)


def wait_ready(handle: SimHandle, timeout_s: float = 30.0, require_health: bool = True) -> None:
    """Wait until /health is 200 (or, with require_health=False, until the port answers at all)."""
    wait_http_ok(
        f"{handle.base_url}/health",
        handle.process,
        handle.log_path,
        "sim engine",
        timeout_s,
        accept=(lambda status: status == 200) if require_health else (lambda status: True),
    )


@contextmanager
def start_sim_engine(
    *, ready_timeout_s: float = 30.0, wait_for_health: bool = True, log_dir: Path | None = None, **options: Any
) -> Iterator[SimHandle]:
    """Run a sim engine until the block ends (then stop it). See the module docstring for options.

    With `startup_delay=...`, pass `wait_for_health=False` to get the handle as soon as the
    port answers (while /health still says 503).
    """
    port = free_port()
    argv = sim_engine_argv(port, **options)
    directory = log_dir or Path(tempfile.gettempdir())
    log_path = directory / f"sim-engine-{port}-{os.getpid()}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    handle = SimHandle(process, port, log_path)
    try:
        wait_ready(handle, ready_timeout_s, require_health=wait_for_health)
        yield handle
    finally:
        handle.stop()
        if log_dir is None:
            log_path.unlink(missing_ok=True)
