"""The relay's count of a stream's SSE events (relay.py, EventCounter), which settles a token
budget for a stream without usage: the same count however the replica's bytes are cut into
blocks, HTTP/1.1 frames or not, `[DONE]` not counted."""

from __future__ import annotations

import json
import random

import pytest

from vlmserve.gateway.admission import asks_for_usage
from vlmserve.gateway.relay import EventCounter


def _event(index: int) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": f"tok{index} data: x"}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _stream(events: int, framed: bool, per_frame: int) -> bytes:
    """`events` completion chunks and [DONE], as an engine writes them: `per_frame` events to an
    HTTP/1.1 frame (the sim batches several), or the bare SSE body."""
    payloads = [_event(i) for i in range(events)] + [b"data: [DONE]\n\n"]
    if not framed:
        return b"".join(payloads)
    frames = []
    for at in range(0, len(payloads), per_frame):
        data = b"".join(payloads[at:at + per_frame])
        frames.append(b"%x\r\n%s\r\n" % (len(data), data))
    return b"".join(frames) + b"0\r\n\r\n"


def _count(blocks: list[bytes]) -> int:
    counter = EventCounter()
    for block in blocks:
        counter.feed(block)
    return counter.events


@pytest.mark.parametrize("framed", [True, False], ids=["chunked", "unframed"])
@pytest.mark.parametrize("per_frame", [1, 7])
def test_every_cut_of_the_bytes_counts_the_same_events(framed: bool, per_frame: int) -> None:
    raw = _stream(40, framed, per_frame)
    assert _count([raw]) == 40  # one block: all events merged
    assert _count([raw[i:i + 1] for i in range(len(raw))]) == 40  # one byte a block: every line start cut
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(raw)), 30))
        blocks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
        assert _count(blocks) == 40, cuts


@pytest.mark.parametrize("cut", range(1, 14))
def test_a_line_start_or_done_cut_between_two_blocks_is_counted_once(cut: int) -> None:
    """Each cut inside `\\ndata: {` and `\\ndata: [DONE]`, the only places a count could slip."""
    event = b'data: {"choices":[]}\n\n'
    done = b"data: [DONE]\n\n"
    raw = event + event + done
    at_second = len(event) - 1  # the LF before the second event's `data:`
    at_done = 2 * len(event) - 1
    for start in (at_second, at_done):
        blocks = [raw[:start + cut], raw[start + cut:]]
        assert _count(blocks) == 2, blocks


def test_counting_starts_empty_and_ignores_a_body_with_only_done() -> None:
    assert EventCounter().events == 0
    assert _count([b"e\r\ndata: [DONE]\n\n\r\n", b"0\r\n\r\n"]) == 0


@pytest.mark.parametrize(("payload", "asked"), [
    ({}, False),
    ({"stream_options": {"include_usage": True}}, True),
    ({"stream_options": {"include_usage": False}}, False),
    ({"stream_options": {"include_usage": "true"}}, False),  # vLLM takes only a boolean
    ({"stream_options": None}, False),
    ({"stream_options": [True]}, False),
])
def test_only_include_usage_true_asks_for_usage(payload: dict[str, object], asked: bool) -> None:
    assert asks_for_usage(payload) is asked
