"""Each hostile or odd answer of tests/helpers/http1_cases.py, sent by a replica to the gateway: what
the project's response reader refuses costs the client a clean error — a 502 in the OpenAI format
when nothing was sent yet, a final SSE error event after the first event — never a hang, and the
replica's connection is never reused; what it accepts reaches the client as the replica sent it.
Both of the gateway's ways of reading a replica's answer are held to the list: streamed (relay.py)
and whole (http1/client.py's `read`, for error and unary answers)."""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager

import pytest

from tests.helpers.http1_cases import BODY, CASES, ResponseCase, case_id, head_splits, payload_before_refusal
from tests.helpers.relay_harness import ScriptedReplica, forwarding, read_answer, scripted_replica, send
from vlmserve.http1.client import ClientError, ClientPool


def idle_connections(pool: ClientPool) -> int:
    return sum(len(idle) for idle in pool._idle.values())


def answering(case: ResponseCase) -> AbstractAsyncContextManager[ScriptedReplica]:
    """A replica that sends the case's bytes in one go, then holds the connection open (a reader
    waiting for more would hang on it)."""

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, case.response)
        await asyncio.sleep(0.3)

    return scripted_replica(script, keep_alive=True)


@pytest.mark.hostile(
    "a replica's streamed answer that HTTP/1.1 framing refuses (http1_cases: chunk sizes 0x1a, +1a, "
    "1_a, overflowing; CL+TE, duplicate CL, chunked+identity, obs-fold, bare LF, NUL, 1xx, not HTTP, "
    "bytes after the body): 502 before the first byte, an SSE error event after; never reused"
)
@pytest.mark.parametrize("case", CASES, ids=case_id)
async def test_a_streamed_answer(case: ResponseCase) -> None:
    async with answering(case) as replica, forwarding([replica.url], max_attempts=1) as harness:
        view = await asyncio.wait_for(read_answer(harness.port), 5)
        await asyncio.sleep(0.05)
        idle = idle_connections(harness.upstream)
    assert view.head is not None and view.ended
    delivered = payload_before_refusal(case)
    if not case.refused or delivered == case.body:  # accepted, or refused only for what came after the body
        assert view.head.status == 200 and view.payload == case.body
        assert idle == (0 if case.refused else 1)
        return
    assert idle == 0
    if not delivered:  # refused before the first payload: nothing was sent, the client gets a 502
        assert view.head.status == 502
        error = json.loads(view.payload)["error"]
        assert error["code"] == "connect_error" and case.error in error["message"], error
        return
    assert view.head.status == 200 and view.payload.startswith(delivered)  # what came before the refusal, whole
    error_event = view.error_event()
    assert error_event is not None and error_event["code"] == "upstream_stream_error"
    assert case.error in error_event["message"], error_event


@pytest.mark.hostile(
    "a replica's whole (error or unary) answer that HTTP/1.1 framing refuses: an error naming the "
    "fault, never a hang; the connection is not pooled"
)
@pytest.mark.parametrize("case", CASES, ids=case_id)
async def test_a_whole_answer(case: ResponseCase) -> None:
    pool = ClientPool(connect_timeout_s=2)
    try:
        async with answering(case) as replica:

            async def read() -> tuple[bytes, dict[str, str]]:
                response = await pool.request("POST", replica.url + "/v1/x", b"", b"{}")
                return await response.read(), response.headers

            if case.refused and payload_before_refusal(case) != case.body:
                with pytest.raises(ClientError, match="sent a malformed") as raised:
                    await asyncio.wait_for(read(), 5)
                assert case.error in str(raised.value)
            else:
                body, headers = await asyncio.wait_for(read(), 5)
                assert body == case.body
                assert all(headers.get(name) == value for name, value in case.headers.items())
            await asyncio.sleep(0.05)
            assert idle_connections(pool) == (0 if case.refused else 1)
    finally:
        pool.close()


async def test_an_answer_split_at_every_byte_of_its_head_is_read_as_one() -> None:
    """The replica's head cut in two at each byte boundary (two writes, a pause between): the same
    answer each time, on one kept-alive connection."""
    splits = list(head_splits())
    scripts = []
    for first, rest in splits:

        async def script(writer: asyncio.StreamWriter, first: bytes = first, rest: bytes = rest) -> None:
            await send(writer, first, rest, pause_s=0.005)

        scripts.append(script)
    pool = ClientPool(connect_timeout_s=2)
    try:
        async with scripted_replica(*scripts, keep_alive=True) as replica:
            for _ in splits:
                response = await pool.request("POST", replica.url + "/v1/x", b"", b"{}")
                assert response.headers["content-type"] == "text/event-stream"
                assert await asyncio.wait_for(response.read(), 5) == BODY
        assert replica.connections == 1
    finally:
        pool.close()
