"""The facts about an engine's chunked SSE frames that the relay's per-chunk path tests for.

One module so that the compiled per-chunk path (`_relay_core.pyx`) and its Python twin
(`relay_core.py`) read the same table and markers.
"""

from __future__ import annotations

TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked body
USAGE_KEY = b'"usage"'  # a block that holds it may carry the engine's token counts
EVENT_END_FRAME = b"\n\n\r\n"  # how a frame ends when its payload ends an SSE event
INLINE_MAX = 4102  # the longest block the inline path takes: a frame with a 3-digit size line


def frame_heads() -> tuple[bytes, ...]:
    """For each block length up to INLINE_MAX, the size line (lowercase hex, as engines write it)
    that a block of exactly one whole frame of that length starts with. A frame of n bytes has a
    k-digit size line and n - k - 4 payload bytes, and the three ranges of k give disjoint
    lengths, so each length has at most one; a length that no frame has gets a line longer than
    the block, which no block starts with."""
    heads = []
    for length in range(INLINE_MAX + 1):
        head = b"-" * (length + 1)
        for digits, low, high in ((1, 1, 0xF), (2, 0x10, 0xFF), (3, 0x100, 0xFFF)):
            if low <= length - digits - 4 <= high:
                head = b"%x\r\n" % (length - digits - 4)
        heads.append(head)
    return tuple(heads)


FRAME_HEADS = frame_heads()
