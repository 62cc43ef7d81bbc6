"""The liveness judge tells busy from hung: slow /health alone never condemns a replica.

A small real HTTP server stands in for an engine whose /health and generation each answer
at once, slowly or never; the watch runs its own thread against it, as under `vlmserve up`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vlmserve.deploy.liveness import LivenessWatch, Subject
from vlmserve.spec import LivenessOptions


class Engine:
    """How long /health and a generation take to answer (seconds; None: never within a test)."""

    def __init__(self) -> None:
        self.health_delay_s: float | None = 0.0
        self.generation_delay_s: float | None = 0.0
        self.health_status = 200
        self.metrics_text = ""
        """What /metrics answers (engine progress; empty: no counters, nothing to judge)."""
        self.generations = 0
        self.released = threading.Event()


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    state = Engine()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, delay_s: float | None, body: bytes, status: int = 200) -> None:
            if delay_s is None:
                state.released.wait(30)
                return
            time.sleep(delay_s)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/metrics":
                self._answer(0.0, state.metrics_text.encode())
                return
            self._answer(state.health_delay_s, b"{}", state.health_status)

        def do_POST(self) -> None:  # noqa: N802
            state.generations += 1
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._answer(state.generation_delay_s, b'{"usage": {"completion_tokens": 1}}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.released.set()
        server.shutdown()
        server.server_close()


def watch(
    url: str, verdicts: list[str], options: LivenessOptions, role: str = "replica"
) -> tuple[LivenessWatch, threading.Event]:
    stopping = threading.Event()
    process = object()
    subject = Subject(url=url, model="m", process=process, role=role)  # type: ignore[arg-type]
    judge = LivenessWatch("replica 0", lambda: subject, lambda _process, reason: verdicts.append(reason), options, stopping)
    judge.start()
    return judge, stopping


FAST = LivenessOptions(interval_s=0.1, timeout_s=0.2, failures=2, probe_timeout_s=0.5)


def test_busy_engine_with_slow_health_is_not_condemned(engine: tuple[Engine, str]) -> None:
    state, url = engine
    state.health_delay_s = 1.0  # /health slower than its timeout, every time...
    state.generation_delay_s = 0.1  # ...but generations are answered: busy, not hung
    verdicts: list[str] = []
    judge, stopping = watch(url, verdicts, FAST)
    stopping.wait(3 * FAST.detection_s)
    stopping.set()
    judge.join(timeout=5)
    assert verdicts == []


def test_hung_engine_is_judged_with_a_reason(engine: tuple[Engine, str]) -> None:
    state, url = engine
    state.health_delay_s = None
    state.generation_delay_s = None
    verdicts: list[str] = []
    judge, stopping = watch(url, verdicts, FAST)
    deadline = time.monotonic() + 30
    while not verdicts and time.monotonic() < deadline:
        time.sleep(0.05)
    stopping.set()
    judge.join(timeout=5)
    assert verdicts and verdicts[0] == "hung: no answer to /health in 0.2 s ×2; no 1-token answer in 0.5 s"


def first_verdict(url: str, options: LivenessOptions, role: str = "replica") -> list[str]:
    """Run a watch until its first verdict (or 30 s), then stop it."""
    verdicts: list[str] = []
    judge, stopping = watch(url, verdicts, options, role)
    deadline = time.monotonic() + 30
    while not verdicts and time.monotonic() < deadline:
        time.sleep(0.05)
    stopping.set()
    judge.join(timeout=5)
    return verdicts


@pytest.mark.hostile(
    "the gateway stops answering /health (SIGSTOP, a wedged event loop): judged hung on "
    "/health alone, with no generation sent through it"
)
def test_a_silent_gateway_is_judged_on_health_alone(engine: tuple[Engine, str]) -> None:
    state, url = engine
    state.health_delay_s = None
    verdicts = first_verdict(url, FAST, role="gateway")
    assert verdicts and verdicts[0] == ("hung: no answer to /health in 0.2 s ×2 "
                                        "(the gateway answers /health at once when it runs)")  # fmt: skip
    assert state.generations == 0  # a generation through the gateway would measure the replicas


def test_a_gateway_that_answers_503_is_alive(engine: tuple[Engine, str]) -> None:
    state, url = engine
    state.health_status = 503  # "no healthy replica": an answer from a running gateway
    verdicts: list[str] = []
    judge, stopping = watch(url, verdicts, FAST, role="gateway")
    stopping.wait(3 * FAST.detection_s)
    stopping.set()
    judge.join(timeout=5)
    assert verdicts == []


STALL = LivenessOptions(interval_s=0.1, timeout_s=0.5, failures=2, probe_timeout_s=0.5, stall_s=0.5)
BUSY_AND_STILL = "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\nvllm:generation_tokens_total 40\n"


def test_a_healthy_api_over_a_stalled_engine_is_judged(engine: tuple[Engine, str]) -> None:
    state, url = engine
    state.metrics_text = BUSY_AND_STILL  # /health answers at once; the counters never move
    state.generation_delay_s = None
    verdicts = first_verdict(url, STALL)
    assert verdicts and verdicts[0].startswith("stalled: 3 waiting and 1 running, no prompt or generation token in "), verdicts
    assert verdicts[0].endswith("s while /health answers; no 1-token answer in 0.5 s"), verdicts


def test_a_stalled_reading_with_a_live_engine_is_not_condemned(engine: tuple[Engine, str]) -> None:
    state, url = engine
    state.metrics_text = BUSY_AND_STILL  # counters that never move (an engine that does not count?)...
    state.generation_delay_s = 0.05  # ...but a 1-token generation is answered: alive
    verdicts: list[str] = []
    judge, stopping = watch(url, verdicts, STALL)
    stopping.wait(6 * STALL.stall_s)  # type: ignore[operator]
    stopping.set()
    judge.join(timeout=5)
    assert verdicts == [] and state.generations >= 1
