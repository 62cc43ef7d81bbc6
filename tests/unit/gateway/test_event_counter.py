"""The relay's count of a stream's SSE events (relay.py, EventCounter), which settles a token
budget for a stream without usage: the same count however the replica's payload is cut into
pieces (llhttp hands the relay de-chunked payload, cut wherever frames and reads end), `[DONE]`
not counted."""

from __future__ import annotations

import json
import random

import pytest

from vlmserve.gateway.admission import asks_for_usage
from vlmserve.gateway.relay import EventCounter


def _event(index: int) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": f"tok{index} data: x"}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _stream(events: int) -> bytes:
    """`events` completion chunks and [DONE]: a stream's payload."""
    return b"".join([_event(i) for i in range(events)] + [b"data: [DONE]\n\n"])


def _count(blocks: list[bytes]) -> int:
    counter = EventCounter()
    for block in blocks:
        counter.feed(block)
    return counter.events


def test_every_cut_of_the_payload_counts_the_same_events() -> None:
    raw = _stream(40)
    assert _count([raw]) == 40  # one block: all events merged
    assert _count([raw[i : i + 1] for i in range(len(raw))]) == 40  # one byte a block: every line start cut
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
        blocks = [raw[: start + cut], raw[start + cut :]]
        assert _count(blocks) == 2, blocks


def test_counting_starts_empty_and_ignores_a_body_with_only_done() -> None:
    assert EventCounter().events == 0
    assert _count([b"data: [DONE]\n\n"]) == 0


@pytest.mark.parametrize(
    ("payload", "asked"),
    [
        ({}, False),
        ({"stream_options": {"include_usage": True}}, True),
        ({"stream_options": {"include_usage": False}}, False),
        ({"stream_options": {"include_usage": "true"}}, False),  # vLLM takes only a boolean
        ({"stream_options": None}, False),
        ({"stream_options": [True]}, False),
    ],
)
def test_only_include_usage_true_asks_for_usage(payload: dict[str, object], asked: bool) -> None:
    assert asks_for_usage(payload) is asked
