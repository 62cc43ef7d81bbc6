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

What to do about a hung replica (kill its process group, restart it) is the supervisor's
business; this module only watches and judges, and never signals a process itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from vlmserve.spec import LivenessOptions


@dataclass(frozen=True)
class Subject:
    """What to watch right now: a replica's URL, the model it serves, and the process's
    identity (a change of `process` means a restart: the failure count starts again)."""

    url: str
    model: str
    process: object


SubjectSource = Callable[[], "Subject | None"]
"""Returns the replica to watch, or None while it is not ready (starting, restarting, stopped)."""
HungSink = Callable[[object, str], None]
"""Called with the watched process's identity and the reason it was judged hung."""


def health_problem(client: httpx.Client, url: str, timeout_s: float) -> str | None:
    """None when GET /health answers 200 within timeout_s, else what went wrong, in words."""
    try:
        reply = client.get(f"{url}/health", timeout=timeout_s)
    except httpx.TimeoutException:
        return f"no answer to /health in {timeout_s:g} s"
    except httpx.TransportError as problem:
        return f"/health failed ({type(problem).__name__})"
    if reply.status_code != 200:
        return f"/health answered {reply.status_code}"
    return None


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
    """Watches one replica until `stopping` is set; calls `on_hung` when it judges it hung."""

    def __init__(
        self,
        label: str,
        subject: SubjectSource,
        on_hung: HungSink,
        options: LivenessOptions,
        stopping: threading.Event,
    ) -> None:
        super().__init__(name=f"vlmserve-liveness-{label.replace(' ', '-')}", daemon=True)
        self._subject = subject
        self._on_hung = on_hung
        self._options = options
        self._stopping = stopping

    def run(self) -> None:
        options = self._options
        failures = 0
        watched: object | None = None
        next_check = time.monotonic() + options.interval_s
        with httpx.Client(trust_env=False) as client:
            while not self._stopping.wait(max(0.0, next_check - time.monotonic())):
                next_check = time.monotonic() + options.interval_s
                subject = self._subject()
                if subject is None or subject.process is not watched:
                    failures = 0
                    watched = subject.process if subject is not None else None
                if subject is None:
                    continue
                problem = health_problem(client, subject.url, options.timeout_s)
                if problem is None:
                    failures = 0
                    continue
                failures += 1
                if failures < options.failures or self._stopping.is_set():
                    continue
                verdict = generation_problem(client, subject.url, subject.model, options.probe_timeout_s)
                if verdict is not None and not self._stopping.is_set():
                    self._on_hung(subject.process, f"hung: {problem} ×{failures}; {verdict}")
                failures = 0
                next_check = time.monotonic() + options.interval_s
