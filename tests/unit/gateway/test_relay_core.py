"""The relay's per-chunk path: the compiled core and its Python twin decide every block alike.

Both are fed the same blocks (every length the inline path can take, and the near misses around
each rule) and must write the same bytes, hand the same blocks to `take_block`, count the same
progress and keep the same usage block. The integration tests (tests/integration/gateway/
test_relay.py) run the core the install built against real sockets.
"""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.gateway import relay_core
from vlmserve.gateway.relay_core import PyRelayCore
from vlmserve.gateway.relay_frames import EVENT_END_FRAME, FRAME_HEADS, INLINE_MAX, USAGE_KEY

compiled = pytest.importorskip("vlmserve.gateway._relay_core", reason="the compiled relay core was not built (no C compiler at install)")


class _Transport:
    """Records what the core writes (the integration tests use real transports)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))


def _recording(base: type) -> Any:
    class Recording(base):
        def __init__(self) -> None:
            super().__init__()
            self.taken: list[bytes] = []

        def take_block(self, data: bytes) -> None:
            self.taken.append(bytes(data))

    core = Recording()
    core.client = _Transport()
    core.fast = True
    return core


def _frame(payload: bytes, size_line: bytes | None = None) -> bytes:
    return (size_line if size_line is not None else b"%x" % len(payload)) + b"\r\n" + payload + b"\r\n"


def _blocks() -> list[Any]:
    blocks: list[Any] = [b"", b"\r\n", b"0\r\n\r\n"]  # (the event loop hands over bytes, nothing else)
    for payload_size in list(range(1, 300)) + [0xFFF - 1, 0xFFF, 0x1000, 0x1001]:
        event = (b"data: " + b"x" * payload_size)[:max(0, payload_size - 2)] + b"\n\n"
        event = event[-payload_size:] if len(event) > payload_size else event
        blocks.append(_frame(event))  # whole and event-ending where the size allows
        blocks.append(_frame(event, (b"%X" % len(event))))  # upper-case hex: not how engines write it
        blocks.append(_frame(event, (b"0%x" % len(event))))  # a leading zero
        blocks.append(_frame(event)[:-1])  # cut short
        blocks.append(_frame(event) + b"0\r\n\r\n")  # the end of body rides along
        blocks.append(_frame(event[:-1] + b"x"))  # ends inside an event
        blocks.append(_frame(event, b"%x" % (len(event) + 1)))  # a size line that lies
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    blocks += [_frame(usage), _frame(usage, b"%X" % len(usage)), _frame(b"data: {\"usage\":null}\n\n")]
    return blocks


def _run(core: Any, blocks: list[Any]) -> tuple[Any, ...]:
    outcomes = []
    for block in blocks:
        core.data_received(block)
        outcomes.append((core.chunks, core.usage_block, core.usage_prev))
    return core.client.written, core.taken, outcomes


def test_the_compiled_core_and_its_python_twin_take_the_same_blocks_inline() -> None:
    blocks = _blocks()
    python_core, compiled_core = _recording(PyRelayCore), _recording(compiled.RelayCore)
    python_run, compiled_run = _run(python_core, blocks), _run(compiled_core, blocks)
    assert compiled_run == python_run
    written, taken, _ = python_run
    assert len(written) > 250 and len(taken) > 1500  # both paths were exercised


@pytest.mark.parametrize("base", [PyRelayCore, compiled.RelayCore], ids=["python", "compiled"])
def test_every_length_the_frame_table_allows_is_inline_and_no_other(base: type) -> None:
    """The frame-head table (relay_frames.py) and the compiled core's arithmetic agree on which
    lengths hold exactly one frame: every such frame goes out inline, a near miss does not."""
    core = _recording(base)
    inline = 0
    for size in range(len(EVENT_END_FRAME), INLINE_MAX + 1):
        head = FRAME_HEADS[size]
        if len(head) > size:  # no single frame has this length
            block = b"1\r\n" + b"x" * (size - 7) + b"\n\n\r\n" if size >= 7 else b"\n\n\r\n"[:size]
            core.data_received(block)
            continue
        if size - len(head) - 2 < len(b"\n\n"):  # a 1-byte payload cannot end an SSE event
            continue
        block = head + b"x" * (size - len(head) - len(EVENT_END_FRAME)) + EVENT_END_FRAME
        core.data_received(block)
        inline += 1
        assert core.client.written[-1] == block
    assert core.chunks == inline == len(core.client.written)
    assert inline == 0xFFF - 1  # payloads of 2..0xFFF bytes: 1-3 hex digits, each ending an event


@pytest.mark.parametrize("base", [PyRelayCore, compiled.RelayCore], ids=["python", "compiled"])
def test_a_core_not_on_the_inline_path_hands_every_block_over(base: type) -> None:
    core = _recording(base)
    core.fast = False
    block = _frame(b"data: " + USAGE_KEY + b"\n\n")
    core.data_received(block)
    assert core.taken == [block] and core.client.written == [] and core.chunks == 0 and core.usage_block == b""


def test_the_gateway_says_which_core_it_runs() -> None:
    assert relay_core.COMPILED is True
    assert relay_core.RelayCore is compiled.RelayCore
