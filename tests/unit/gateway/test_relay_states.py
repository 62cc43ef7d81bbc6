"""The relay's state machine (relay.py) and the replica client (http1/client.py) keep every guarantee
of the gateway's stream path, on real sockets: a scripted replica, a real `Forwarder`, the client
connection as the server gives it to handlers (tests/helpers/relay_harness.py), a raw client
reading with the project's response reader.
"""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from tests.helpers.relay_harness import (
    SSE_HEAD,
    ClientView,
    ForwardingHarness,
    ScriptedReplica,
    chat_request,
    forwarding,
    frame,
    read_answer,
    scripted_replica,
    send,
    token,
)
from vlmserve.gateway.relay import StreamRelay
from vlmserve.gateway.routing import Outcome
from vlmserve.http1.client import ClientConnection

END = frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
USAGE = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


async def assert_replica_let_go(replica: ScriptedReplica, harness: ForwardingHarness, left_at: float) -> None:
    """After the client left at `left_at`: the replica's connection closed within 1.5 s (the engine
    aborts the request), the attempt finished once, abandoned, and nothing is left in flight."""
    for _ in range(40):
        if replica.closed_at and harness.policy.finished:
            break
        await asyncio.sleep(0.05)
    assert replica.closed_at and replica.closed_at[0] - left_at < 1.5
    assert harness.policy.finished == [Outcome.ABANDONED] and harness.in_flight() == 0


async def test_frames_split_across_reads_arrive_whole_with_usage_and_first_token() -> None:
    big = token("x" * 200_000)  # one event far larger than a socket read
    framed = frame(token("a")) + frame(big) + frame(token("b", USAGE)) + END
    cut = [SSE_HEAD + framed[:3], framed[3:40], framed[40:70_000], framed[70_000:150_001], framed[150_001:-3], framed[-3:]]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, *cut, pause_s=0.02)

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        answer = await read_answer(harness.port)
    assert answer.head is not None and answer.head.status == 200 and answer.ended
    assert answer.texts() == ["a", "x" * 200_000, "b"] and answer.payload.endswith(b"data: [DONE]\n\n")
    log = harness.logs[0]
    assert (log.status, log.prompt_tokens, log.completion_tokens) == ("200", 3, 3)
    assert harness.policy.first_tokens == 1 and harness.policy.finished == [Outcome.COMPLETED]
    assert harness.in_flight() == 0


async def test_a_usage_event_cut_between_frames_is_read_whole() -> None:
    """An event cut between two frames (here the usage event, its "usage" in the second) reaches the
    client whole and is parsed whole; completion tokens come first, so the quick regex cannot read it."""
    usage_event = token("", {"completion_tokens": 9, "prompt_tokens": 4, "total_tokens": 13})
    cut_at = usage_event.index(b'"usage"') - 3
    frames = [frame(token(f"t{i}")) for i in range(4)] + [frame(usage_event[:cut_at]), frame(usage_event[cut_at:]), END]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, *frames, pause_s=0.02)  # one frame per read

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        answer = await read_answer(harness.port)
    assert answer.texts() == ["t0", "t1", "t2", "t3", ""]
    assert (harness.logs[0].prompt_tokens, harness.logs[0].completion_tokens) == (4, 9)


async def test_the_first_token_is_noted_from_the_engines_prompt_count_or_after_the_second_piece() -> None:
    first_with_usage = frame(token("a", {"prompt_tokens": 11, "completion_tokens": 1, "total_tokens": 12}))

    async def with_count(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + first_with_usage, pause_s=0.3)
        await send(writer, frame(token("b")) + END)

    async with scripted_replica(with_count) as replica, forwarding([replica.url]) as harness:
        task = asyncio.ensure_future(read_answer(harness.port))
        await asyncio.sleep(0.2)
        assert harness.policy.first_tokens == 1  # from the first piece: it carried the prompt count
        await task


# ---- an armed stream: the replica's head is in, its first payload is not -------------------------


async def test_an_armed_stream_sends_the_head_with_the_first_token() -> None:
    answer = [frame(token(f"t{i}")) for i in range(5)] + [END]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, pause_s=0.4)
        await send(writer, *answer, pause_s=0.02)

    first_reads: list[tuple[float, bytes]] = []
    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        sent_at = time.monotonic()
        view = await read_answer(harness.port, on_first=lambda data: first_reads.append((time.monotonic(), data)))
    ((at, first),) = first_reads
    assert at - sent_at >= 0.35  # no head before the first token
    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert body.startswith(frame(token("t0")))  # the first token left with the head, in one write
    assert view.texts() == [f"t{i}" for i in range(5)] and view.ended


@pytest.mark.hostile(
    "a replica sends its head, then closes, resets, sends an empty body or garbage before its first "
    "token: the request is retried on another replica and the client sees only that one's answer"
)
@pytest.mark.parametrize("failure", ["close", "reset", "empty body", "garbage", "half an event, then close"])
async def test_a_replica_failing_between_its_head_and_first_token_is_retried(failure: str) -> None:
    answer = frame(token("a")) + frame(token("b")) + END
    calls = {"n": 0}

    async def script(writer: asyncio.StreamWriter) -> None:  # the first call fails, the next answers
        calls["n"] += 1
        await send(writer, SSE_HEAD, pause_s=0.1)
        if calls["n"] > 1:
            await send(writer, answer)
        elif failure == "reset":
            writer.transport.abort()
        elif failure == "empty body":
            await send(writer, b"0\r\n\r\n", pause_s=0.1)
        elif failure == "garbage":
            await send(writer, b"zz\r\nnot a frame\r\n", pause_s=0.1)
        elif failure == "half an event, then close":
            await send(writer, frame(token("lost")[:20]), pause_s=0.1)

    async with (
        scripted_replica(script, script) as one,
        scripted_replica(script, script) as two,
        forwarding([one.url, two.url]) as harness,
    ):
        view = await read_answer(harness.port)
    assert view.head is not None and view.head.status == 200 and view.ended
    assert view.texts() == ["a", "b"] and view.error_event() is None
    log = harness.logs[0]
    reason = "closed_before_first_byte" if failure == "empty body" else "connect_error"
    assert log.retries == 1 and log.attempts[0]["error"] == reason and log.status == "200"
    assert harness.policy.finished == [Outcome.FAILED, Outcome.COMPLETED] and calls["n"] == 2


@pytest.mark.hostile(
    "a client hangs up after the replica's head, before the first token: the replica connection "
    "closes within 1.5 s, the request is not retried, nothing is left in flight"
)
async def test_a_client_leaving_before_the_first_token_closes_the_replica_connection() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, pause_s=10)  # an engine still computing the first token
        await send(writer, frame(token("late")) + b"0\r\n\r\n")

    async with scripted_replica(script, script) as replica, forwarding([replica.url]) as harness:
        _, writer = await asyncio.open_connection("127.0.0.1", harness.port)
        writer.write(chat_request())
        await asyncio.sleep(0.3)
        writer.close()
        await assert_replica_let_go(replica, harness, time.monotonic())
        assert replica.posts == 1  # not retried


async def test_a_first_token_timeout_is_retried_on_another_replica() -> None:
    async def slow(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, pause_s=5)

    async def quick(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + frame(token("a")) + END)

    async with (
        scripted_replica(slow) as one,
        scripted_replica(quick) as two,
        forwarding([one.url, two.url], first_token_timeout_s=0.3) as harness,
    ):
        view = await read_answer(harness.port)
    assert view.texts() == ["a"] and harness.logs[0].attempts[0]["error"] == "first_token_timeout"


# ---- mid-stream ----------------------------------------------------------------------------------


@pytest.mark.hostile(
    "a replica dies mid-stream (between frames, mid-event) or sends malformed chunk framing: the "
    "client gets the whole events so far and one error event, never a partial event"
)
@pytest.mark.parametrize(
    "tail",
    ["between frames", "mid event", "malformed frame", "bad size line", "no CRLF after a frame", "event cut across frames"],
)
async def test_a_replica_failing_mid_stream_ends_with_an_error_event(tail: str) -> None:
    cut = token("c")
    piece = {
        "between frames": b"",
        "mid event": frame(cut)[:25],
        "malformed frame": b"zz\r\nnot a frame\r\n",
        "bad size line": b"-5\r\nhello\r\n",
        "no CRLF after a frame": b"5\r\nhelloXX",
        "event cut across frames": frame(cut[:30]) + frame(cut[30:50]),
    }[tail]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + frame(token("a")), frame(token("b")), pause_s=0.05)
        await send(writer, piece, pause_s=0.05)
        writer.transport.abort()

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        view = await read_answer(harness.port)
    assert view.ended  # a proper end of body after the error event
    assert view.texts() == ["a", "b"]
    error = view.error_event()
    assert error is not None and error["code"] == "upstream_stream_error", error
    if tail in ("malformed frame", "bad size line", "no CRLF after a frame"):
        assert "sent a malformed body" in error["message"], error
    assert harness.logs[0].status == "stream_error" and harness.policy.finished == [Outcome.FAILED]


@pytest.mark.hostile("a replica stalls mid-stream: the idle-chunk watchdog ends the stream with a 504 error event")
async def test_a_stall_meets_the_idle_chunk_timeout() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + frame(token("a")), frame(token("b")) + frame(token("c")[:30]), pause_s=0.05)
        await asyncio.sleep(5)

    async with scripted_replica(script) as replica, forwarding([replica.url], idle_chunk_timeout_s=0.4) as harness:
        view = await read_answer(harness.port)
    assert view.ended and view.texts() == ["a", "b"]
    error = view.error_event()
    assert error is not None and error["code"] == "idle_chunk_timeout"


@pytest.mark.hostile("a client hangs up mid-stream: the replica connection closes within 1.5 s, nothing left in flight")
async def test_a_client_leaving_mid_stream_closes_the_replica_connection() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD)
        for i in range(200):  # 10 s of tokens unless the gateway hangs up
            await send(writer, frame(token(f"t{i}")), pause_s=0.05)

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        reader, writer = await asyncio.open_connection("127.0.0.1", harness.port)
        writer.write(chat_request())
        await reader.read(4096)
        await asyncio.sleep(0.2)
        writer.close()
        await assert_replica_let_go(replica, harness, time.monotonic())


@pytest.mark.hostile("a client stops reading a long stream: the gateway stops reading the replica, then relays it whole")
@pytest.mark.parametrize("piece_bytes", [60_000, 3_000], ids=["60 KB events", "3 KB events"])
async def test_a_slow_client_holds_back_the_replica(piece_bytes: int) -> None:
    piece = frame(token("y" * piece_bytes))
    total = 24_000_000 // piece_bytes  # more than loopback's socket buffers hold on the way
    sent = {"frames": 0}

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD)
        for _ in range(total):
            await send(writer, piece)
            sent["frames"] += 1
        await send(writer, END)

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        reader, writer = await asyncio.open_connection("127.0.0.1", harness.port, limit=2**16)
        writer.write(chat_request())
        first = await reader.read(65536)
        await asyncio.sleep(1.0)  # the client reads nothing for a while
        held_back = sent["frames"]
        relaying = [c for c in gc.get_objects() if isinstance(c, ClientConnection) and c.listener is not None]
        reading = [c.transport.is_reading() for c in relaying if c.transport is not None]
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            more = await asyncio.wait_for(reader.read(2**20), 10)
            assert more
            rest += more
        writer.close()
    view = ClientView()
    view.raw = first + rest
    assert reading == [False], reading
    assert held_back < total, held_back
    assert harness.clients[0].pauses >= 1
    assert view.raw.count(b"data: ") == total + 1 and view.raw.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert harness.logs[0].status == "200"


# ---- bodies and clients of every kind ----------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "close-delimited"])
async def test_an_unchunked_replica_body_is_relayed(framing: str) -> None:
    body = token("a") + token("b") + b"data: [DONE]\n\n"

    async def script(writer: asyncio.StreamWriter) -> None:
        length = b"Content-Length: %d\r\n" % len(body) if framing == "content-length" else b""
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%s\r\n" % length
        await send(writer, head + body[:10], body[10:], pause_s=0.02)

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        view = await read_answer(harness.port)
    assert view.ended and view.head is not None and view.head.chunked
    assert view.payload == body and harness.logs[0].status == "200"


async def test_an_http10_client_gets_the_payload_without_framing() -> None:
    framed = SSE_HEAD + frame(token("a")) + frame(token("b")) + END

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, framed)

    async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
        view = await read_answer(harness.port, http10=True)
    head, _, rest = view.raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert rest == token("a") + token("b") + b"data: [DONE]\n\n" and view.ended


async def test_a_kept_alive_connection_carries_the_next_stream() -> None:
    answer = SSE_HEAD + frame(token("a")) + END

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, answer)

    async with scripted_replica(script, script, keep_alive=True) as replica, forwarding([replica.url]) as harness:
        for _ in range(2):
            assert (await read_answer(harness.port)).texts() == ["a"]
    assert replica.connections == 1 and replica.posts == 2


async def test_a_replica_closing_an_idle_connection_costs_no_request() -> None:
    answer = SSE_HEAD + frame(token("a")) + END

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, answer)

    async with scripted_replica(script, script, script) as replica, forwarding([replica.url]) as harness:
        for _ in range(3):  # the scripted replica closes every connection after one answer
            view = await read_answer(harness.port)
            assert view.texts() == ["a"] and view.error_event() is None
            await asyncio.sleep(0.05)
    assert replica.posts == 3 and all(log.retries == 0 for log in harness.logs)


@pytest.mark.hostile(
    "a replica sends bytes after the end of its streamed body: the answer ends at the body's end and the connection is not reused"
)
async def test_bytes_after_the_body_are_not_passed_on_and_the_connection_is_not_reused() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + frame(token("a")) + END + b"HTTP/1.1 200 OK\r\nsmuggled: yes\r\n\r\n")

    async def clean(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + frame(token("b")) + END)

    async with scripted_replica(script, clean, keep_alive=True) as replica, forwarding([replica.url]) as harness:
        first = await read_answer(harness.port)
        second = await read_answer(harness.port)
    assert first.texts() == ["a"] and first.payload.endswith(b"data: [DONE]\n\n") and b"smuggled" not in first.raw
    assert second.texts() == ["b"] and replica.connections == 2


async def test_a_finished_relay_is_freed_without_the_cycle_collector() -> None:
    """The relay's per-state handlers are methods bound to it: once detached it lets go of them, so
    a finished stream's relay (and its last pieces) go at once, not at the next collection."""

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + frame(token("a", USAGE)) + END)

    gc.collect()
    gc.disable()
    try:
        async with scripted_replica(script) as replica, forwarding([replica.url]) as harness:
            assert (await read_answer(harness.port)).texts() == ["a"]
            await asyncio.sleep(0.05)
            left = [o for o in gc.get_objects() if isinstance(o, StreamRelay)]
    finally:
        gc.enable()
    assert harness.logs[0].status == "200" and left == []
