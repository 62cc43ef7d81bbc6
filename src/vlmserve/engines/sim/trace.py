"""Per-request emission trace: when the engine really sent each request's tokens, one JSON line per request.

A client's TTFT and ITL can only be judged against the truth, and the sim engine is the one
place that knows it: it decides when every token leaves. `--trace-file PATH` appends, when a
request ends, one line

    {"request_id": "…", "client_request_id": "…" | null, "arrival_s": …, "first_token_s": …,
     "chunk_s": [t0, t1, …], "chunk_tokens": [1, 1, …], "outcome": "finished" | "aborted" | …}

Times are `time.monotonic()` seconds (CLOCK_MONOTONIC, the same clock in every process on the
machine). `arrival_s` is when the handler took the request (body read and parsed);
`chunk_s[i]` is the clock read once per engine step just after the step's pre-rendered chunks
were written (first and last chunks are written a few microseconds later in the same pass), so
each is within the `/debug/timing` lateness of the real write. `client_request_id` is the
request's X-Request-ID header, for matching a client's own per-request records.

Cost when on: one list append per emitted chunk and one buffered line per request; off (the
default), one `is None` test per step. Lines are flushed when the engine stops, or every
FLUSH_EVERY requests, so a reader should stop the engine (or wait) before reading the tail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

FLUSH_EVERY = 256
"""Requests between two flushes of the trace file."""


class EmissionTrace:
    """Appends one JSON line per ended request to a file; open for the engine's lifetime."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8", buffering=1 << 16)
        self._unflushed = 0

    def write(
        self,
        request_id: str,
        client_request_id: str | None,
        arrival_s: float,
        chunk_s: list[float],
        chunk_tokens: list[int],
        outcome: str,
    ) -> None:
        """One request's line; chunk_s[0] is its first token's emission time (absent if none was emitted)."""
        if self._file is None:
            return
        line = {
            "request_id": request_id,
            "client_request_id": client_request_id,
            "arrival_s": arrival_s,
            "first_token_s": chunk_s[0] if chunk_s else None,
            "chunk_s": chunk_s,
            "chunk_tokens": chunk_tokens,
            "outcome": outcome,
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._unflushed += 1
        if self._unflushed >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._unflushed = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
