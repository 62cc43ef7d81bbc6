"""Is a ready replica still alive? Tell a hung engine from a busy one, within a known time.

A crashed engine is easy: its process exits and the supervisor sees the exit code. A hung
one is not: a stopped (SIGSTOP), deadlocked or swapping engine keeps its pid and its port,
the kernel still accepts connections, and every request sent to it waits for minutes. So
each ready replica is watched from its own thread:

- every `interval_s` (start to start) it gets `GET /health` with `timeout_s`;
- one slow answer proves nothing: real vLLM on a few CPU cores answers /health slowly
  under load. Only `failures` failed checks in a row count as "no progress for a while";
- then a 1-token generation with `probe_timeout_s` decides. An answer means busy but
  alive (the count starts again); no answer means hung, and `on_hung` is called with a
  one-line reason such as "hung: no answer to /health in 3 s x3; no 1-token answer in 4 s".
- a replica whose /health passes is also asked for its engine metrics (vlmserve.deploy.progress):
  requests waiting or running while no token is processed for `stall_s` is a stuck engine core
  behind a healthy API server; the same 1-token generation then decides.
- the gateway is watched too, on /health alone: it answers from its own event loop at once
  (whatever it says: 503 "no healthy replica" is an answer), so `failures` checks in a row
  without any answer mean it is stopped (SIGSTOP) or wedged, and it is judged hung at once (a
  generation through it would measure the replicas, not the gateway).

What to do about a hung replica (kill its process group, restart it) is the supervisor's
business; this module only watches and judges, and never signals a process itself.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from vlmserve.deploy.progress import StallJudge, parse_progress
from vlmserve.spec import LivenessOptions

STALL_READS_PER_WINDOW = 8
"""How often, per stall window, a replica's /metrics is read (no more often than every interval_s):
a vLLM /metrics page is large, and a stall needs the whole window to be judged anyway."""


@dataclass(frozen=True)
class Subject:
    """What to watch right now: a replica's URL, the model it serves, and the process's
    identity (a change of `process` means a restart: the failure count starts again)."""

    url: str
    model: str
    process: object
    role: Literal["replica", "gateway"] = "replica"


SubjectSource = Callable[[], "Subject | None"]
"""Returns the replica to watch, or None while it is not ready (starting, restarting, stopped)."""
HungSink = Callable[[object, str], None]
"""Called with the watched process's identity and the reason it was judged hung."""


def health_problem(client: httpx.Client, url: str, timeout_s: float, *, any_status_ok: bool = False) -> str | None:
    """None when GET /health answers 200 within timeout_s (any status, with any_status_ok),
    else what went wrong, in words."""
    try:
        reply = client.get(f"{url}/health", timeout=timeout_s)
    except httpx.TimeoutException:
        return f"no answer to /health in {timeout_s:g} s"
    except httpx.TransportError as problem:
        return f"/health failed ({type(problem).__name__})"
    if reply.status_code != 200 and not any_status_ok:
        return f"/health answered {reply.status_code}"
    return None


def stall_problem(client: httpx.Client, url: str, timeout_s: float, judge: StallJudge, now: float) -> str | None:
    """The judge's verdict on one reading of the engine's /metrics; None when there is nothing to
    judge (no answer, no token counters: not evidence either way)."""
    try:
        reply = client.get(f"{url}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    reading = parse_progress(reply.text)
    return judge.observe(reading, now) if reading is not None else None


def generation_problem(client: httpx.Client, url: str, model: str, timeout_s: float) -> str | None:
    """None when a 1-token chat generation answers within timeout_s (any HTTP answer: an
    engine that says 429 or 400 is alive), else what went wrong, in words."""
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "temperature": 0.0}
    try:
        reply = client.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
    except httpx.TimeoutException:
        return f"no 1-token answer in {timeout_s:g} s"
    except httpx.TransportError as problem:
        return f"1-token generation failed ({type(problem).__name__})"
    if reply.status_code >= 500:
        return f"1-token generation answered {reply.status_code}"
    return None


class LivenessWatch(threading.Thread):
    """Watches one member until `stopping` is set; calls `on_hung` when it judges it hung.

    The watch itself never dies of a surprise: an exception in one round is reported through
    `say` (once until a round succeeds again) and the next round runs as usual."""

    def __init__(
        self,
        label: str,
        subject: SubjectSource,
        on_hung: HungSink,
        options: LivenessOptions,
        stopping: threading.Event,
        say: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(name=f"vlmserve-liveness-{label.replace(' ', '-')}", daemon=True)
        self._label = label
        self._subject = subject
        self._on_hung = on_hung
        self._options = options
        self._stopping = stopping
        self._say = say
        self._failures = 0
        self._watched: object | None = None
        self._stall = StallJudge(options.stall_s) if options.stall_s is not None else None
        self._next_read = 0.0
        self._broken: str | None = None

    def run(self) -> None:
        options = self._options
        next_check = time.monotonic() + options.interval_s
        # verify=False: the gateway may serve TLS with a self-signed certificate; the check is "it answers"
        with httpx.Client(trust_env=False, verify=False) as client:  # noqa: S501 - see above
            while not self._stopping.wait(max(0.0, next_check - time.monotonic())):
                try:
                    self._round(client)
                except Exception as problem:  # noqa: BLE001 - a watch that dies stops watching for good
                    self._report(f"{type(problem).__name__}: {problem}")
                else:
                    self._broken = None
                next_check = time.monotonic() + options.interval_s

    def _round(self, client: httpx.Client) -> None:
        """One check of the member; calls on_hung when this round completes a verdict."""
        options = self._options
        subject = self._subject()
        if subject is None or subject.process is not self._watched:
            self._failures = 0
            self._watched = subject.process if subject is not None else None
            if self._stall is not None:
                self._stall.reset()
                self._next_read = 0.0
        if subject is None:
            return
        gateway = subject.role == "gateway"
        problem = health_problem(client, subject.url, options.timeout_s, any_status_ok=gateway)
        if problem is None:
            self._failures = 0
            now = time.monotonic()
            if gateway or self._stall is None or self._stopping.is_set() or now < self._next_read:
                return
            self._next_read = now + self._stall.window_s / STALL_READS_PER_WINDOW
            stalled = stall_problem(client, subject.url, options.timeout_s, self._stall, now)
            if stalled is None:
                return
            self._stall.reset()
            verdict = generation_problem(client, subject.url, subject.model, options.probe_timeout_s)
            if verdict is not None and not self._stopping.is_set():
                self._on_hung(subject.process, f"{stalled}; {verdict}")
            return
        self._failures += 1
        if self._failures < options.failures or self._stopping.is_set():
            return
        failures, self._failures = self._failures, 0
        if gateway:
            self._on_hung(subject.process, f"hung: {problem} ×{failures} (the gateway answers /health at once when it runs)")
            return
        verdict = generation_problem(client, subject.url, subject.model, options.probe_timeout_s)
        if verdict is not None and not self._stopping.is_set():
            self._on_hung(subject.process, f"hung: {problem} ×{failures}; {verdict}")

    def _report(self, problem: str) -> None:
        """Say once per run of failing rounds that the watch is failing (a repeat would flood the log)."""
        if problem == self._broken:
            return
        self._broken = problem
        line = f"liveness check of {self._label} failed: {problem}; the watch goes on"
        try:
            if self._say is not None:
                self._say(line)
            else:
                print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001, S110 - nowhere left to say it; keep watching
            pass
