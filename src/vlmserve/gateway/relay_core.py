"""The relay's per-chunk path: one block from the replica's socket, passed on.

`RelayCore` is the base of relay.py's `StreamRelay` and holds the one method the event loop
calls for every block, `data_received`. The common block, one whole data frame that ends an SSE
event, is written to the client at once (with the usage and progress bookkeeping the gateway
owes); any other block goes to the subclass's `take_block`.

It exists twice with one behaviour: compiled (`_relay_core.pyx`, built at install when a C
compiler is there) and the Python class below, used when the compiled module is absent. The
compiled one saves the interpreter frame and bytecode per chunk, about 2-3 µs of a gateway's
~30 µs of CPU per streamed chunk at 256 streams (benchmarks/gateway_overhead.py; figures in
docs/benchmarks.md). tests/unit/test_relay_core.py feeds both the same blocks and checks they
do the same.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from vlmserve.gateway.relay_frames import EVENT_END_FRAME, FRAME_HEADS, INLINE_MAX, USAGE_KEY


class PyRelayCore:
    """The per-chunk path in Python (the compiled twin's reference)."""

    # Read on every block: they come first so that they share a cache line.
    __slots__ = ("fast", "chunks", "client", "usage_block", "usage_prev")

    def __init__(self) -> None:
        self.fast = False  # whole frames take the inline path (the subclass sets it)
        self.chunks = 0  # blocks passed on: the stall watchdog's sign of progress (watchdog.py)
        self.client: asyncio.Transport | None = None  # the client's transport, once the head is out
        self.usage_block = b""  # the last block that mentioned usage
        self.usage_prev = b""  # the block before it, when that one ended inside an SSE event

    def data_received(self, data: bytes) -> None:
        size = len(data)
        if self.fast and size <= INLINE_MAX and data.startswith(FRAME_HEADS[size]) and data.endswith(EVENT_END_FRAME):
            self.chunks += 1
            # bytes.find, not `in`: CPython 3.11's `bytes in bytes` first tries the right side as
            # an integer and formats (then drops) a TypeError each time (3 % of the gateway's CPU)
            if data.find(USAGE_KEY) >= 0:
                self.usage_prev, self.usage_block = b"", data
            self.client.write(data)  # type: ignore[union-attr]
            return
        self.take_block(data)

    def take_block(self, data: bytes) -> None:
        """Any block but a whole event-ending frame on the inline path (the subclass's)."""
        raise NotImplementedError


if TYPE_CHECKING:  # one interface: the compiled class mirrors PyRelayCore's
    RelayCore = PyRelayCore
    COMPILED: bool
else:
    try:
        from vlmserve.gateway._relay_core import RelayCore
    except ImportError:  # no C compiler at install: the Python twin, slower per chunk
        RelayCore = PyRelayCore
        COMPILED = False
    else:
        COMPILED = True
