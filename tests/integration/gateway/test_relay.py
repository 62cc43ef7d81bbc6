"""The stream path (relay.py, http1/client.py) keeps the gateway's guarantees through the whole gateway:
its server's client connection (back-pressure and loss reach the relay through `listener`), its
routes, admission and audit log.

Two kinds of replica: the sim engine (what an engine sends), and a scripted HTTP/1.1 server on a
real socket that sends exactly the bytes a test gives it, split and timed as the test says
(tests/helpers/relay_harness.py). The relay's states and every framing case are tested without the
rest of the gateway in tests/unit/gateway/test_relay_states.py, test_relay_differential.py and
test_replica_hostile_answers.py; here each guarantee that involves the server is held end to end.
The client is aiohttp (or a raw socket where the wire bytes matter).
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway
from tests.helpers.relay_harness import SSE_HEAD, ScriptedReplica, frame, scripted_replica, send, token
from tests.helpers.sim import SimHandle
from vlmserve.http1.client import ClientConnection


async def assert_replica_let_go(replica: ScriptedReplica, gw: Any, left_at: float) -> None:
    """After the client left at `left_at`: the gateway closed the replica's connection within 1.5 s
    (the engine aborts the request) and nothing is left in flight."""
    for _ in range(40):
        if replica.closed_at:
            break
        await asyncio.sleep(0.05)
    assert replica.closed_at and replica.closed_at[0] - left_at < 1.5
    await asyncio.sleep(0.1)
    assert gw.gateway.pool.replicas[0].in_flight == 0


# ---- with the sim engine ------------------------------------------------------------------------


async def test_usage_and_first_token_are_accounted(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with running_gateway(constant_engines[:1], audit_log=audit) as gw, aiohttp.ClientSession() as session:
        with_usage = await post_chat(session, gw.base_url, chat_body("a molar", max_tokens=12))
        plain = chat_body("a molar", max_tokens=7)
        plain.pop("stream_options")
        without_usage = await post_chat(session, gw.base_url, plain)
        outstanding = gw.gateway._outstanding_tokens() or {}
    assert with_usage.done and with_usage.completion_tokens == 12 and with_usage.content_chunks == 12
    assert without_usage.done and without_usage.content_chunks == 7
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert records[0]["completion_tokens"] == 12 and records[0]["prompt_tokens"] > 0 and records[0]["ttft_ms"] > 0
    assert abs(records[1]["completion_tokens"] - 7) <= 2  # without usage: estimated from the chunks relayed
    assert all(r["status"] == "200" for r in records)
    assert all(value == 0 for value in outstanding.values())  # first-token and finish both reached the policy


# ---- with a scripted replica --------------------------------------------------------------------


async def test_frames_split_across_reads_arrive_whole() -> None:
    big = token("x" * 200_000)  # one event far larger than a socket read
    framed = (
        frame(token("a"))
        + frame(big)
        + frame(token("b", {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}))
        + frame(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )
    cut = [SSE_HEAD + framed[:3], framed[3:40], framed[40:70_000], framed[70_000:150_001], framed[150_001:-3], framed[-3:]]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, *cut, pause_s=0.02)

    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("q"))
    assert result.status == 200 and result.done and result.error is None
    assert [e["choices"][0]["delta"]["content"] for e in result.events if e.get("choices")] == ["a", "x" * 200_000, "b"]
    assert result.completion_tokens == 3


async def test_usage_event_cut_between_frames_is_read_whole(tmp_path: Path) -> None:
    """An event cut between two frames (here the usage event, its "usage" in the second) is held
    until it ends, so the engine's counts are read from the whole event. Completion tokens come before prompt tokens in
    this usage object, so the quick regex over one block cannot read them and the event is parsed."""
    usage_event = token("", {"completion_tokens": 9, "prompt_tokens": 4, "total_tokens": 13})
    cut_at = usage_event.index(b'"usage"') - 3
    frames = [frame(token(f"t{i}")) for i in range(8)]
    frames += [frame(usage_event[:cut_at]), frame(usage_event[cut_at:]), frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, *frames, pause_s=0.02)  # one frame per read

    audit = tmp_path / "audit.jsonl"
    async with (
        scripted_replica(script) as replica,
        running_gateway([replica.url], audit_log=audit) as gw,
        aiohttp.ClientSession() as session,
    ):
        result = await post_chat(session, gw.base_url, chat_body("q"))
    assert result.status == 200 and result.done and result.error is None
    assert [e["choices"][0]["delta"]["content"] for e in result.events if e.get("choices")] == [f"t{i}" for i in range(8)] + [""]
    record = json.loads(audit.read_text().splitlines()[0])
    assert (record["prompt_tokens"], record["completion_tokens"]) == (4, 9)


@pytest.mark.hostile(
    "a replica dies mid-stream (between frames, mid-frame) or sends a malformed chunk frame: the client "
    "gets the tokens so far and one error event"
)
@pytest.mark.parametrize("where", ["between_frames", "mid_frame", "malformed_frame"])
async def test_replica_vanishing_mid_stream_ends_with_an_error_event(where: str) -> None:
    start = SSE_HEAD + frame(token("a")) + frame(token("b"))
    tail = {"between_frames": b"", "mid_frame": frame(token("c"))[:25], "malformed_frame": b"zz\r\nnot a frame\r\n"}[where]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, start, pause_s=0.05)
        await send(writer, tail, pause_s=0.05)
        writer.transport.abort()

    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("q"))  # a malformed client-side body would raise here
        metrics = await (await session.get(gw.base_url + "/metrics")).text()
    assert result.status == 200 and not result.done
    assert [e["choices"][0]["delta"]["content"] for e in result.events if e.get("choices")] == ["a", "b"]
    assert result.error is not None and result.error["code"] == "upstream_stream_error"
    assert 'status="stream_error"' in metrics


@pytest.mark.hostile("a client hangs up mid-stream: the replica connection closes within 1.5 s, nothing left in flight")
async def test_client_disconnect_closes_the_replica_connection() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD)
        for i in range(200):  # 10 s of tokens unless the gateway hangs up
            await send(writer, frame(token(f"t{i}")), pause_s=0.05)

    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw:
        async with aiohttp.ClientSession() as session:
            async with session.post(gw.base_url + "/v1/chat/completions", json=chat_body("q")) as response:
                await response.content.readany()
                await asyncio.sleep(0.2)
            left_at = time.monotonic()
        await assert_replica_let_go(replica, gw, left_at)


@pytest.mark.hostile("a client stops reading a 72 MB stream: the gateway stops reading the replica, then relays it whole")
@pytest.mark.parametrize("piece_bytes", [60_000, 3_000], ids=["60 KB frames", "3 KB frames"])
async def test_slow_client_holds_back_the_replica(piece_bytes: int) -> None:
    """The server's client connection says when its socket is full (`listener.pause()`), which
    stops the reading of the replica until the socket drains."""
    piece = frame(token("y" * piece_bytes))
    total = 72_000_000 // piece_bytes  # more than the kernel's socket buffers on loopback can hold (they autotune to tens of MB)
    sent = {"frames": 0}

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD)
        for i in range(total):
            await send(writer, piece, pause_s=0.01 if i < 10 else 0.0)  # the first frames arrive one per read
            sent["frames"] += 1
        await send(writer, frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw:
        connector = aiohttp.TCPConnector()
        async with aiohttp.ClientSession(connector=connector, read_bufsize=2**16) as session:
            async with session.post(gw.base_url + "/v1/chat/completions", json=chat_body("q")) as response:
                first = await response.content.readany()
                await asyncio.sleep(1.5)  # the client reads nothing for a while
                held_back = sent["frames"]
                relaying = [c for c in gc.get_objects() if isinstance(c, ClientConnection) and c.listener is not None]
                reading = [c.transport.is_reading() for c in relaying if c.transport is not None]
                body = first + await response.content.read()
        del replica
    # the gateway stopped reading from the replica, which could not send all of it; afterwards all of it arrives intact
    assert reading == [False], reading
    assert held_back < total, held_back
    assert body.count(b"data: ") >= total and body.endswith(b"data: [DONE]\n\n")


async def test_content_length_replica_body_is_reframed() -> None:
    body = token("a") + token("b") + b"data: [DONE]\n\n"

    async def script(writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
        await send(writer, head + body[:10], body[10:], pause_s=0.02)

    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("q"))
    assert result.done and [e["choices"][0]["delta"]["content"] for e in result.events] == ["a", "b"]


async def test_http10_client_gets_the_payload_without_framing() -> None:
    framed = SSE_HEAD + frame(token("a")) + frame(token("b")) + frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, framed)

    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw:
        payload = json.dumps(chat_body("q")).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )
        raw = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
    assert rest == token("a") + token("b") + b"data: [DONE]\n\n"


async def test_a_replica_closing_an_idle_connection_costs_no_request() -> None:
    answer = SSE_HEAD + frame(token("a")) + frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    calls = {"n": 0}

    async def script(writer: asyncio.StreamWriter) -> None:
        calls["n"] += 1
        await send(writer, answer)

    async with (
        scripted_replica(script, script, script) as replica,
        running_gateway([replica.url]) as gw,
        aiohttp.ClientSession() as session,
    ):
        for _ in range(3):  # the scripted replica closes every connection after one answer
            result = await post_chat(session, gw.base_url, chat_body("q"))
            assert result.done and result.error is None
        retries = await (await session.get(gw.base_url + "/metrics")).text()
    assert calls["n"] == 3 and "vlmserve_gateway_retries_total{" not in retries


# ---- an armed stream: the replica's head is in, its first token is not ------------------------


def raw_chat_request(port: int) -> socket.socket:
    body = json.dumps(chat_body("q")).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


async def test_an_armed_stream_sends_the_head_with_the_first_token() -> None:
    """The replica's head comes 0.4 s before its first token (as an engine's does): the client's
    head waits for the token (a failure until then is still retried) and leaves in the same write."""
    answer = [frame(token(f"t{i}")) for i in range(5)] + [frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"]

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, pause_s=0.4)
        await send(writer, *answer, pause_s=0.02)

    loop = asyncio.get_running_loop()
    async with scripted_replica(script) as replica, running_gateway([replica.url]) as gw:
        sock = await loop.run_in_executor(None, raw_chat_request, gw.port)
        sock.settimeout(0.25)
        with pytest.raises(TimeoutError):
            await loop.run_in_executor(None, sock.recv, 65536)  # no head before the first token
        sock.settimeout(5)
        first = await loop.run_in_executor(None, sock.recv, 65536)
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            more = await loop.run_in_executor(None, sock.recv, 65536)
            assert more, "the gateway closed before the end of the body"
            rest += more
        sock.close()
    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert body.startswith(answer[0])  # the first token left with the head
    assert body + rest == b"".join(answer)


@pytest.mark.hostile(
    "a replica sends its head, then closes, resets or sends an empty body before its first token: the "
    "request is retried on another replica and the client sees only that one's answer"
)
@pytest.mark.parametrize("failure", ["close", "reset", "empty body"])
async def test_a_replica_failing_between_its_head_and_first_token_is_retried(failure: str, tmp_path: Path) -> None:
    answer = frame(token("a")) + frame(token("b")) + frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    calls = {"n": 0}

    async def script(writer: asyncio.StreamWriter) -> None:  # both replicas: the first call fails, the next answers
        calls["n"] += 1
        await send(writer, SSE_HEAD, pause_s=0.1)
        if calls["n"] > 1:
            await send(writer, answer)
        elif failure == "reset":
            writer.transport.abort()
        elif failure == "empty body":
            await send(writer, b"0\r\n\r\n", pause_s=0.1)
        # "close": the handler returns, and the scripted replica closes the connection

    audit = tmp_path / "audit.jsonl"
    async with (
        scripted_replica(script, script) as one,
        scripted_replica(script, script) as two,
        running_gateway([one.url, two.url], audit_log=audit) as gw,
        aiohttp.ClientSession() as session,
    ):
        result = await post_chat(session, gw.base_url, chat_body("q"))
    assert result.status == 200 and result.done and result.error is None
    assert [e["choices"][0]["delta"]["content"] for e in result.events if e.get("choices")] == ["a", "b"]
    record = json.loads(audit.read_text().splitlines()[0])
    reason = "closed_before_first_byte" if failure == "empty body" else "connect_error"
    assert record["retries"] == 1 and record["attempts"][0]["error"] == reason and record["status"] == "200"
    assert calls["n"] == 2


@pytest.mark.hostile(
    "a client hangs up after the replica's head, before the first token: the replica connection "
    "closes within 1.5 s, the request is not retried, nothing is left in flight"
)
async def test_a_client_leaving_before_the_first_token_closes_the_replica_connection() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD, pause_s=10)  # an engine still computing the first token
        await send(writer, frame(token("late")) + b"0\r\n\r\n")

    loop = asyncio.get_running_loop()
    async with scripted_replica(script, script) as replica, running_gateway([replica.url]) as gw:
        sock = await loop.run_in_executor(None, raw_chat_request, gw.port)
        await asyncio.sleep(0.3)
        sock.close()
        await assert_replica_let_go(replica, gw, time.monotonic())
        assert replica.posts == 1  # not retried


# ---- the text-only fast path skips the media walks, never the media rules ------------------------


@pytest.mark.hostile("a media URL past the text-only fast path, its key plain or JSON-escaped (image\\u005furl): refused")
@pytest.mark.parametrize("key", ["image_url", "image\\u005furl"])
async def test_media_rules_hold_with_escaped_keys(constant_engines: list[SimHandle], key: str) -> None:
    body = (
        '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image_url", '
        '"%s": {"url": "http://media.example/x.png"}}]}]}' % (MODEL, key)
    ).encode()
    async with running_gateway(constant_engines[:1]) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, body)
    assert result.status == 400 and result.body["error"]["code"] == "media_url_not_allowed"
