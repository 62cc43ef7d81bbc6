"""The lean lane (lean_lane.py, lean_http.py): plain engine-work POSTs are served off the socket,
everything else is handed to aiohttp with its bytes and answered as aiohttp always did.

Which path answered is visible on the wire: aiohttp's responses carry its `Server` header, the
lean lane's carry none. Requests go over raw sockets so that the exact bytes are the test's.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Iterator

import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, running_gateway, sim_engines
from tests.helpers.sim import SimHandle


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with sim_engines(1, tmp_path_factory.mktemp("lean"), ttft_ms=5, itl_ms=1) as handles:
        yield handles[0]


def _post(body: dict | bytes, *, path: str = "/v1/chat/completions", extra: bytes = b"",
          length: int | None = None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    size = len(data) if length is None else length
    return (b"POST %s HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path.encode(), extra, size, data))


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def served_by_aiohttp(self) -> bool:
        return "aiohttp" in self.headers.get("server", "")


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response (after any 100 Continue): Content-Length or chunked body, de-chunked."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    while head.startswith(b"HTTP/1.1 100"):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(status, headers, body)


async def _exchange(port: int, raw: bytes, answers: int = 1) -> list[Answer]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return [await _read_answer(reader) for _ in range(answers)]
    finally:
        writer.close()


def _error_code(answer: Answer) -> str | None:
    return json.loads(answer.body)["error"]["code"]


async def test_a_plain_streamed_post_is_served_by_the_lean_lane(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        [answer] = await _exchange(gw.port, _post(chat_body("hello", max_tokens=4)))
    assert answer.status == 200 and not answer.served_by_aiohttp
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["x-request-id"] and answer.headers["date"]
    assert answer.body.rstrip().endswith(b"data: [DONE]")


async def test_keep_alive_pipelining_and_unary_answers_in_order(engine: SimHandle) -> None:
    """Two requests in one write: answered in order on one connection, the unary one with its length."""
    unary = chat_body("first", max_tokens=2, stream=False)
    streamed = chat_body("second", max_tokens=3)
    async with running_gateway([engine]) as gw:
        first, second = await _exchange(gw.port, _post(unary) + _post(streamed), answers=2)
    assert first.status == 200 and not first.served_by_aiohttp
    assert json.loads(first.body)["object"] == "chat.completion"
    assert second.status == 200 and second.body.rstrip().endswith(b"data: [DONE]")


async def test_other_requests_on_the_connection_go_to_aiohttp_and_are_answered(engine: SimHandle) -> None:
    """A GET after a lean POST hands the connection over; aiohttp answers it and the next POST."""
    get_health = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
    body = chat_body("again", max_tokens=2, stream=False)
    async with running_gateway([engine]) as gw:
        lean, health, after = await _exchange(gw.port, _post(body) + get_health + _post(body), answers=3)
    assert not lean.served_by_aiohttp
    assert health.status == 200 and health.served_by_aiohttp and json.loads(health.body)["status"] == "ok"
    assert after.status == 200 and after.served_by_aiohttp


async def test_a_body_that_arrives_in_pieces_is_served(engine: SimHandle) -> None:
    raw = _post(chat_body("slow body", max_tokens=2, stream=False))
    async with running_gateway([engine]) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        for start in range(0, len(raw), 17):
            writer.write(raw[start:start + 17])
            await writer.drain()
            await asyncio.sleep(0.005)
        answer = await _read_answer(reader)
        writer.close()
    assert answer.status == 200 and not answer.served_by_aiohttp


async def test_gateway_errors_on_the_lean_lane_are_openai_errors(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        bad_json, no_object, unknown_model = await _exchange(
            gw.port, _post(b"{not json") + _post(b"[1, 2]") + _post(chat_body("x", model="no-such-model")), answers=3)
    assert (bad_json.status, _error_code(bad_json)) == (400, "invalid_json")
    assert "not valid JSON" in json.loads(bad_json.body)["error"]["message"]
    assert (no_object.status, _error_code(no_object)) == (400, "invalid_json")
    assert (unknown_model.status, _error_code(unknown_model)) == (404, "model_not_found")
    assert MODEL in json.loads(unknown_model.body)["error"]["message"]
    assert not any(a.served_by_aiohttp for a in (bad_json, no_object, unknown_model))


HANDED_OVER = {
    # (raw request, the status aiohttp answers it with)
    "chunked upload": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", 200),
    "expect 100-continue": (_post(chat_body("e", max_tokens=2, stream=False), extra=b"Expect: 100-continue\r\n"), 200),
    "query string": (_post(chat_body("q", max_tokens=2, stream=False), path="/v1/chat/completions?x=1"), 200),
    "content-length and transfer-encoding": (_post(b"{}", extra=b"Transfer-Encoding: chunked\r\n"), 400),
    "two content-lengths": (_post(b"{}", extra=b"Content-Length: 2\r\n"), 400),
    "header with a NUL": (_post(b"{}", extra=b"X-Evil: a\x00b\r\n"), 400),
    "encoded dot segment": (_post(b"{}", path="/v1/%2e%2e/chat/completions"), 400),
    "unknown path": (_post(b"{}", path="/v1/chat/completions/../../metrics"), 400),
}


@pytest.mark.hostile("requests outside the lean lane's HTTP subset: chunked or smuggling bodies, duplicate lengths, "
                     "NUL bytes, encoded paths — handed to aiohttp with their bytes")
@pytest.mark.parametrize("case", sorted(HANDED_OVER))
async def test_requests_outside_the_subset_are_answered_by_aiohttp(engine: SimHandle, case: str) -> None:
    raw, status = HANDED_OVER[case]
    if case == "chunked upload":
        payload = json.dumps(chat_body("c", max_tokens=2, stream=False)).encode()
        raw = raw % (len(payload), payload)
    async with running_gateway([engine]) as gw:
        [answer] = await _exchange(gw.port, raw)
    assert answer.status == status, answer.body[:200]
    assert answer.served_by_aiohttp


@pytest.mark.hostile("an oversized Content-Length on the lean path")
async def test_an_oversized_body_is_refused_with_413_before_it_is_read(engine: SimHandle) -> None:
    async with running_gateway([engine], max_body_bytes=4096) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(_post(b"", length=10_000_000))  # announces 10 MB, sends none of it
        answer = await _read_answer(reader)
        writer.close()
    assert answer.status == 413 and _error_code(answer) == "body_too_large"
    assert "4096-byte limit" in json.loads(answer.body)["error"]["message"]


@pytest.mark.hostile("a head that looks lean, then turns out not to be, sent slowly: the header timeout still holds")
async def test_a_head_handed_over_midway_keeps_only_the_time_left(engine: SimHandle) -> None:
    """Half a lean head now; after most of the header timeout, a line that hands it to aiohttp;
    aiohttp must answer 408 when the original time is up, not a whole timeout later."""
    async with running_gateway([engine], header_timeout_s=1.5) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        loop = asyncio.get_running_loop()
        started = loop.time()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n")
        await asyncio.sleep(1.0)
        writer.write(b"Expect: 100-continue\r\nX-More: ")  # not lean: aiohttp takes it, head still incomplete
        closed = await asyncio.wait_for(reader.read(), 10)
        elapsed = loop.time() - started
        writer.close()
    assert closed.startswith(b"HTTP/1.1 408")
    assert elapsed < 2.5


@pytest.mark.hostile("a client that vanishes mid-stream on the lean lane")
async def test_a_client_gone_mid_stream_cancels_the_request(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(_post(chat_body("long", max_tokens=2000)))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"\r\n")  # a first frame arrived
        writer.transport.abort()
        gateway = gw.gateway

        async def settled() -> bool:
            return gateway.requests_in_progress == 0 and all(r.in_flight == 0 for r in gateway.pool.replicas)

        for _ in range(100):
            if await settled():
                break
            await asyncio.sleep(0.05)
    assert await settled()


async def test_idle_lean_connections_close_after_the_keep_alive_timeout(engine: SimHandle) -> None:
    async with running_gateway([engine], keepalive_timeout_s=0.5) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(_post(chat_body("k", max_tokens=2, stream=False)))
        answer = await _read_answer(reader)
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert answer.status == 200 and not answer.served_by_aiohttp
    assert rest == b""


def _connection_tasks() -> list[asyncio.Task]:
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__ == "LeanConnection._serve"]  # type: ignore[union-attr]


async def test_one_task_serves_a_connections_requests_and_ends_with_it(engine: SimHandle) -> None:
    """Kept-alive requests are served in turn by one task, which holds nothing of the last request
    while the connection idles, and ends when the connection is handed to aiohttp or closed."""
    from vlmserve.gateway.lean_http import LeanRequest
    from vlmserve.gateway.lean_lane import LeanStream

    async with running_gateway([engine]) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        tasks = []
        for i in range(3):
            writer.write(_post(chat_body(f"turn {i}", max_tokens=3)))
            answer = await _read_answer(reader)
            assert answer.status == 200 and not answer.served_by_aiohttp
            tasks.append(_connection_tasks())
        assert len(tasks[0]) == 1 and tasks[0] == tasks[1] == tasks[2]
        await asyncio.sleep(0.05)
        gc.collect()
        held = [o for o in gc.get_objects() if isinstance(o, (LeanRequest, LeanStream))]
        assert held == []  # the idle task keeps neither the last request (nor its body) nor its answer

        writer.write(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")  # outside the subset: aiohttp takes the connection
        health = await _read_answer(reader)
        assert health.status == 200 and health.served_by_aiohttp
        await asyncio.sleep(0.05)
        assert _connection_tasks() == []

        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(_post(chat_body("then gone", max_tokens=2, stream=False)))
        assert (await _read_answer(reader)).status == 200
        assert len(_connection_tasks()) == 1
        writer.close()  # the client leaves while the connection idles
        for _ in range(100):
            if not _connection_tasks():
                break
            await asyncio.sleep(0.02)
        assert _connection_tasks() == []
