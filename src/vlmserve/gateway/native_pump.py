"""The relay's native data path: a streamed answer's chunks moved by C, not by Python per chunk.

relay.py hands a stream over (`StreamRelay._hand_to_pump`) once it has reached its steady state:
the response head and the first frames are out, the first token is accounted, the client is a
plain-TCP lean-lane client taking the replica's frames verbatim, and nothing waits in the
client's write buffer. From then on `_native_relay.Pump` (C, one per gateway process) reads the
replica's socket and writes whole frames to the client's, with no Python per chunk: the event loop
watches the pump's epoll set and, when any pumped socket is ready, makes one call (`run_once`)
that serves them all. Python hears of a stream again once, when it ends, and takes over: usage,
the end of the answer, an error event for a replica that failed, the client's next request.
A stream whose token budget is settled from its SSE events is never handed over: the pump
counts reads, not events (relay.py says why).

Kept on this path, as on relay.py's: only whole frames reach the client (an incomplete one is
held), usage from the last block that mentioned it, a block counter the idle watchdog reads
(`Exchange.native_chunks`), the replica not read while the client's socket is full, and a client
gone (its socket hung up or refused a write; or the lean lane saw it first and cancelled) ends
the stream at once. The pump's own copies of the two descriptors (dup) are closed when the
stream ends, so the event loop's transports stay the owners.

Why C: at 256 streams the Python relay spent about as much CPU per chunk as vllm-router, and two
compilers over the Python cut at most 4 % (docs/benchmarks.md); the cost was the event loop's and
the relay's work per chunk, which the pump does in a few hundred instructions.

`RELAY_CHOICES`: `auto` uses the pump where the extension was built (Linux with a C compiler at
install), `native` requires it, `python` never uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vlmserve.errors import UserError
from vlmserve.gateway.upstream import (NO_CRLF_AFTER_CHUNK, SIZE_LINE_TOO_LONG, bad_size_line, lost_mid_stream,
                                       malformed_body)

try:
    from vlmserve.gateway import _native_relay  # type: ignore[attr-defined]
except ImportError:  # not built here (no C compiler at install, or not Linux)
    _native_relay = None

RELAY_CHOICES = ("auto", "native", "python")


def native_available() -> bool:
    return _native_relay is not None


def check_relay_choice(choice: str) -> None:
    """A one-line error for an unknown choice, or `native` where the extension is missing."""
    if choice not in RELAY_CHOICES:
        raise UserError(f"--relay must be one of {', '.join(RELAY_CHOICES)}, got {choice!r}")
    if choice == "native" and _native_relay is None:
        raise UserError("--relay native: the native relay was not built in this install (it needs Linux and a C "
                        "compiler when vlmserve is installed); reinstall with one, or use --relay auto")


@dataclass(frozen=True, slots=True)
class PumpResult:
    """How a pumped stream ended, and what relay.py needs of it."""

    end: int  # _native_relay.END_*
    failure: int  # _native_relay.FAIL_* when end is END_UPSTREAM_FAILED
    errno: int
    chunks: int  # blocks read from the replica by the pump
    usage_prev: bytes
    usage_block: bytes
    trailing: bool  # bytes came after the body's end: do not reuse the replica's connection
    held: bytes  # an incomplete frame, never sent
    bad_line: bytes

    @property
    def completed(self) -> bool:
        return self.end == _native_relay.END_COMPLETED

    @property
    def upstream_failed(self) -> bool:
        return self.end == _native_relay.END_UPSTREAM_FAILED

    def why(self) -> str:
        """The replica's failure, worded as relay.py words it."""
        native = _native_relay
        if self.failure == native.FAIL_CLOSED:
            return lost_mid_stream(None)
        if self.failure == native.FAIL_ERRNO:
            return lost_mid_stream(type(OSError(self.errno, "")).__name__)  # OSError picks the subclass (ConnectionResetError)
        return malformed_body({
            native.FAIL_SIZE_LINE_LONG: SIZE_LINE_TOO_LONG,
            native.FAIL_BAD_SIZE_LINE: bad_size_line(self.bad_line),
            native.FAIL_NO_CRLF: NO_CRLF_AFTER_CHUNK,
            native.FAIL_FRAME_TOO_LONG: "a chunk over 16 MiB",
        }.get(self.failure, f"failure {self.failure}"))


class NativePump:
    """The gateway process's pump, served by its event loop, and whom to tell when a stream ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        assert _native_relay is not None
        self._pump: Any = _native_relay.Pump()
        self._loop = loop
        self._on_end: dict[int, Callable[[PumpResult], None]] = {}
        self.started = 0  # streams handed over, for the metrics
        self._fileno = self._pump.fileno()
        loop.add_reader(self._fileno, self._on_ready)

    def start(self, upstream_fd: int, client_fd: int, on_end: Callable[[PumpResult], None]) -> int:
        """Pump from now on; `on_end` is called once, from the event loop, when the stream ends
        (or is cancelled). Returns the stream's handle. Raises OSError."""
        handle = self._pump.start(upstream_fd, client_fd)
        self.started += 1
        self._on_end[handle] = on_end
        return handle

    def chunks(self, handle: int) -> int:
        return self._pump.chunks(handle)

    def cancel(self, handle: int) -> PumpResult | None:
        """Stop pumping now (the pump never touches the stream again) and report its end, as
        `run_once` would; None when that was reported already."""
        on_end = self._on_end.pop(handle, None)
        raw = self._pump.cancel(handle)
        if raw is None:
            return None
        result = PumpResult(*raw)
        if on_end is not None:
            on_end(result)
        return result

    @property
    def running(self) -> int:
        return self._pump.running()

    def _on_ready(self) -> None:
        for handle, raw in self._pump.run_once():
            on_end = self._on_end.pop(handle, None)
            if on_end is not None:
                on_end(PumpResult(*raw))

    def close(self) -> None:
        """Streams still pumped are cancelled (and told so); the epoll set is closed."""
        for handle in list(self._on_end):
            self.cancel(handle)
        self._loop.remove_reader(self._fileno)
        self._pump.close()

