"""A random differential test of the stream path: whatever the replica's framing, read splits and
timing, and however slowly the client reads, the client receives exactly the payload the replica
sent, the whole events in order, and the gateway's usage and event counts are right.

Each seed draws: events of random sizes (a few bytes to 70 KB), usage or not, the replica's body
framing (chunked with frames cut anywhere, even inside an event; Content-Length; ended by the
close), random write splits with pauses between some of them, a client that pauses between reads
on small socket buffers (so the gateway's relay is paused and resumed), and whether the gateway
counts the stream's events (a budgeted tenant without usage).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.helpers.relay_harness import forwarding, read_answer, scripted_replica, token
from vlmserve.gateway.routing import Outcome

SEEDS = range(24)


def random_stream(rng: random.Random) -> tuple[bytes, int, bool]:
    """(payload, completion events, with usage)."""
    count = rng.randint(1, 80)
    sizes = [rng.choice([1, 5, 40, 300, 3000, 3000]) for _ in range(count)]
    for _ in range(rng.choice([0, 0, 1, 3])):
        sizes[rng.randrange(count)] = 70_000  # events larger than a socket read
    events = [token(f"{i}:" + "x" * size) for i, size in enumerate(sizes)]
    with_usage = rng.random() < 0.5
    if with_usage:
        events.append(token("", {"prompt_tokens": 17, "completion_tokens": count, "total_tokens": 17 + count}))
    return b"".join(events) + b"data: [DONE]\n\n", len(events), with_usage


def random_cuts(rng: random.Random, data: bytes, pieces: int) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(pieces, len(data) - 1))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def replica_wire(rng: random.Random, payload: bytes) -> tuple[bytes, str]:
    framing = rng.choice(["chunked", "chunked", "content-length", "close"])
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        frames = random_cuts(rng, payload, rng.randint(1, 80))  # frame boundaries anywhere, inside events too
        body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + body, framing
    if framing == "content-length":
        return head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload, framing
    return head + b"\r\n" + payload, framing


@pytest.mark.parametrize("seed", SEEDS)
async def test_the_client_receives_exactly_what_the_replica_sent(seed: int) -> None:
    rng = random.Random(seed)
    payload, events, with_usage = random_stream(rng)
    wire, framing = replica_wire(rng, payload)
    writes = random_cuts(rng, wire, rng.randint(1, 120))
    pauses = [rng.random() < 0.2 for _ in writes]
    counts_events = rng.random() < 0.5
    slow_client = rng.random() < 0.5

    async def script(writer: asyncio.StreamWriter) -> None:
        for piece, pause in zip(writes, pauses):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.002 if pause else 0)

    delays = iter([0.1])  # a slow client first reads nothing for a while: the gateway's buffers fill

    def read_delay() -> float:
        return next(delays, 0.003 if rng.random() < 0.3 else 0.0)

    async with (
        scripted_replica(script) as replica,
        forwarding(
            [replica.url],
            high_water=rng.choice([512, 4096, 65536]),
            send_buffer=4096 if slow_client else None,
            counts_events=counts_events,
        ) as harness,
    ):
        view = await read_answer(
            harness.port,
            read_delays=read_delay if slow_client else None,
            receive_buffer=4096 if slow_client else None,
            timeout_s=30,
        )
    assert view.error is None and view.ended, (framing, view.error)
    assert view.payload == payload, (framing, len(view.payload), len(payload))
    assert len(view.events()) == events  # every event whole and parseable (events() checks)
    log = harness.logs[0]
    assert log.status == "200" and harness.policy.finished == [Outcome.COMPLETED] and harness.in_flight() == 0
    assert harness.policy.first_tokens == 1
    if with_usage:
        assert (log.prompt_tokens, log.completion_tokens) == (17, events - 1)
    elif counts_events:
        assert log.completion_tokens == events  # from the gateway's count of events, not of pieces
    if slow_client and len(payload) > 150_000:
        assert harness.clients[0].pauses >= 1  # the relay was paused, and resumed, on the way
