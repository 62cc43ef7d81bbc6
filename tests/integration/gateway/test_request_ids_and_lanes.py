"""Client-chosen ids and awkward HTTP framing against a real gateway (sockets, a sim engine).

- The gateway's own id keys every count; the client's X-Request-ID is recorded and echoed only,
  bounded and checked; X-Session-ID pins hold bounded memory (request_info.py, routing/session.py).
- The lanes (lean_lane.py, client_limits.py): one head-size limit whatever the segmentation, a
  half-closed client's GET answered and its engine work cancelled, `Connection: close` with
  pipelined bytes answered once.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway, sim_engines
from tests.helpers.sim import SimHandle


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with sim_engines(1, tmp_path_factory.mktemp("ids"), ttft_ms=20, itl_ms=2) as handles:
        yield handles[0]


def _post(body: bytes, *extra: bytes, path: bytes = b"/v1/chat/completions") -> bytes:
    """A raw POST head and body, with `extra` header lines (each without its CRLF)."""
    head = [b"POST " + path + b" HTTP/1.1", b"Host: gateway", b"Content-Type: application/json",
            b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _unary(content: str = "hi") -> bytes:
    return json.dumps(chat_body(content, max_tokens=4, stream=False)).encode()


async def _exchange(port: int, *pieces: bytes, shut_write: bool = False, timeout_s: float = 10.0) -> bytes:
    """Send `pieces` (one write each, the socket flushed between them), optionally shut the sending
    side, and read until the gateway closes (or `timeout_s`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for n, piece in enumerate(pieces):
            if n:
                await asyncio.sleep(0.05)  # separate segments: the gateway reads them apart
            writer.write(piece)
            await writer.drain()
        if shut_write:
            writer.write_eof()  # at once: the answer is still being made
        received = b""
        try:
            async with asyncio.timeout(timeout_s):
                while chunk := await reader.read(65536):
                    received += chunk
        except TimeoutError:
            pass
        return received
    finally:
        writer.close()


def _statuses(received: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", received)]


# ---- ids ---------------------------------------------------------------------------------------


@pytest.mark.hostile("clients reuse one X-Request-ID for concurrent requests: the routing counts stay exact")
async def test_colliding_client_request_ids_leave_no_phantom_load(engine: SimHandle) -> None:
    async with running_gateway([engine], policy="least-outstanding-tokens") as gw, aiohttp.ClientSession() as session:
        results = await asyncio.gather(*[
            post_chat(session, gw.base_url, chat_body("same id", max_tokens=30), headers={"X-Request-ID": "dup-1"})
            for _ in range(8)])
        assert [r.status for r in results] == [200] * 8
        outstanding = gw.gateway._outstanding_tokens()
        assert outstanding is not None and set(outstanding.values()) == {0}, outstanding
        gateway_ids = {r.headers["X-Request-ID"] for r in results}
        assert len(gateway_ids) == 8 and "dup-1" not in gateway_ids
        assert {r.headers["X-Client-Request-ID"] for r in results} == {"dup-1"}


async def test_the_audit_line_keeps_the_gateway_id_and_the_clients_apart(engine: SimHandle, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with running_gateway([engine], audit_log=audit) as gw, aiohttp.ClientSession() as session:
        mine = await post_chat(session, gw.base_url, chat_body("x", stream=False), headers={"X-Request-ID": "order-17"})
        plain = await post_chat(session, gw.base_url, chat_body("y", stream=False))
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["client_request_id"] for r in records] == ["order-17", None]
    assert [r["id"] for r in records] == [mine.headers["X-Request-ID"], plain.headers["X-Request-ID"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", r["id"]) for r in records)
    assert mine.headers["X-Client-Request-ID"] == "order-17" and "X-Client-Request-ID" not in plain.headers


@pytest.mark.hostile("an X-Request-ID that is not Latin-1, too long or holds spaces: a 400, never a 500")
@pytest.mark.parametrize("value", ["req-\u20ac".encode(), b"r" * 129, b"two words"], ids=["euro sign", "129 chars", "space"])
async def test_bad_client_request_ids_get_a_400(engine: SimHandle, value: bytes) -> None:
    async with running_gateway([engine]) as gw:
        received = await _exchange(gw.port, _post(_unary(), b"X-Request-ID: " + value, b"Connection: close"))
    assert _statuses(received) == [400], received[:300]
    body = json.loads(received.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "invalid_request_id" and "X-Request-ID" in body["error"]["message"]


@pytest.mark.hostile("thousands of long X-Session-ID values: each pin holds a bounded key")
async def test_long_session_ids_pin_under_a_bounded_key(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw, aiohttp.ClientSession() as session:
        long_ids = [f"{n:04d}" + "s" * 6000 for n in range(40)]
        for session_id in long_ids + long_ids[:1]:
            result = await post_chat(session, gw.base_url, chat_body("pin", max_tokens=1, stream=False),
                                     headers={"X-Session-ID": session_id})
            assert result.status == 200
        pins = gw.gateway.policy._sessions  # type: ignore[attr-defined]
        assert len(pins) == 40 and max(len(key) for key in pins) <= 64


# ---- the lanes ---------------------------------------------------------------------------------


@pytest.mark.hostile("a 9 KB request head in one write and split at 9,000 bytes: one limit, one answer")
async def test_the_head_size_limit_does_not_depend_on_segmentation(engine: SimHandle) -> None:
    request = _post(_unary(), b"X-Padding: " + b"p" * 9000, b"Connection: close")
    async with running_gateway([engine]) as gw:
        whole = await _exchange(gw.port, request)
        split = await _exchange(gw.port, request[:9000], request[9000:])
    assert _statuses(whole) == _statuses(split) == [400], (whole[:200], split[:200])


@pytest.mark.hostile("a client that shuts its sending side (SHUT_WR) after a whole GET still gets its answer")
async def test_a_half_closed_client_gets_its_get_answered(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        received = await _exchange(gw.port, b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n", shut_write=True)
    assert _statuses(received) == [200], received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1])["status"] == "ok"


@pytest.mark.hostile("a client that sends engine work and shuts its sending side (SHUT_WR): taken to have left, "
                     "the work is cancelled (no generation queued for a client that hung up), the gateway serves on")
async def test_engine_work_from_a_half_closed_client_is_cancelled(engine: SimHandle) -> None:
    request = _post(json.dumps(chat_body("x", max_tokens=40, stream=False)).encode())
    async with running_gateway([engine]) as gw:
        received = await _exchange(gw.port, request, shut_write=True)
        assert received == b"", received[:300]  # closed, no answer: documented in docs/gateway.md
        after = await _exchange(gw.port, _post(_unary(), b"Connection: close"))
    assert _statuses(after) == [200], after[:300]


@pytest.mark.hostile("Connection: close followed by pipelined bytes: the first request answered, the rest ignored")
@pytest.mark.parametrize("rest", [b"garbage\r\n\r\n", None], ids=["garbage", "a second request"])
async def test_connection_close_answers_the_first_request_only(engine: SimHandle, rest: bytes | None) -> None:
    first = _post(_unary(), b"Connection: close")
    following = rest if rest is not None else _post(_unary("second"))
    async with running_gateway([engine]) as gw:
        received = await _exchange(gw.port, first + following)
    assert _statuses(received) == [200], received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1])["model"] == MODEL
