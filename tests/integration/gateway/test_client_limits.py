"""Slow, idle, malformed and too many clients, and HTTPS: what the gateway's socket tolerates
(vlmserve/http1/server.py's limits, http1/tls.py). Request framing itself is tested in
test_http1_server.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway, sim_engines, wait_until
from tests.helpers.sim import SimHandle
from tests.helpers.tls import self_signed_certificate

SLOW_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with sim_engines(1, tmp_path_factory.mktemp("limits"), ttft_ms=5, itl_ms=1) as handles:
        yield handles[0]


async def _read_until_closed(reader: asyncio.StreamReader, timeout_s: float) -> bytes | None:
    """Everything the gateway sends until it closes the connection; None if it is still open after timeout_s."""
    try:
        return await asyncio.wait_for(reader.read(), timeout_s)
    except asyncio.TimeoutError:
        return None
    except ConnectionError:
        return b""


async def _slowloris(port: int, head: bytes, byte_interval_s: float = 0.1) -> bytes | None:
    """Send `head` a byte at a time (about 25 s in all); what came back before the gateway closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def trickle() -> None:
        try:
            for i in range(len(head)):
                writer.write(head[i : i + 1])
                await writer.drain()
                await asyncio.sleep(byte_interval_s)
        except ConnectionError:
            pass

    sender = asyncio.create_task(trickle())
    try:
        return await _read_until_closed(reader, timeout_s=12)
    finally:
        sender.cancel()
        writer.close()


@pytest.mark.hostile("slowloris: connections that send their headers a byte at a time, or nothing")
async def test_slow_header_senders_are_closed_and_others_are_served(engine: SimHandle) -> None:
    async with running_gateway([engine], header_timeout_s=1.0) as gw, aiohttp.ClientSession() as session:
        loris = [asyncio.create_task(_slowloris(gw.port, SLOW_HEAD)) for _ in range(50)]
        silent = [asyncio.create_task(_slowloris(gw.port, b"")) for _ in range(10)]
        await asyncio.sleep(0.3)
        served = await post_chat(session, gw.base_url, chat_body("meanwhile", max_tokens=4, stream=False))
        answers = await asyncio.gather(*loris, *silent)
        timeouts = gw.gateway.client_stats.header_timeouts
    assert served.status == 200 and served.body["object"] == "chat.completion"
    # every one closed long before its headers were done (None: still open), with a 408
    assert all(answer is not None and answer.startswith(b"HTTP/1.1 408") for answer in answers)
    assert timeouts >= 60


def _send_after_408(port: int, first_line: bytes) -> tuple[bytes, str]:
    """A client whose head times out: what it reads until the gateway's half-close, and what happens to
    the bytes it sends after that ('taken', or the error a reset gives)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(first_line + b"Host: gateway\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        try:
            for _ in range(3):  # 0.3 s of it, well inside the gateway's linger
                sock.sendall(b"X-Still-Typing: " + b"a" * 1000 + b"\r\n")
                time.sleep(0.1)
        except OSError as err:
            return answer, type(err).__name__
    return answer, "taken"


@pytest.mark.parametrize(
    "first_line", [b"POST /v1/chat/completions HTTP/1.1\r\n", b"GET /v1/models HTTP/1.1\r\n"], ids=["post", "get"]
)
@pytest.mark.hostile("a client that keeps sending after its header timeout")
async def test_after_a_408_the_gateway_reads_on_before_closing(engine: SimHandle, first_line: bytes) -> None:
    """A socket closed with unread bytes, or one that bytes reach after its close, answers with a reset,
    and a client that gets the reset before it has read the 408 sees an error instead. So the gateway
    half-closes after the 408 and reads (and drops) what still comes for a moment (CLOSE_LINGER_S), as
    it does after a 503 refusal. Before, the client's second write here failed with a broken pipe."""
    async with running_gateway([engine], header_timeout_s=0.5) as gw:
        answer, later_bytes = await asyncio.to_thread(_send_after_408, gw.port, first_line)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
    assert later_bytes == "taken"


@pytest.mark.hostile("idle keep-alive connections held open to exhaust file descriptors")
async def test_idle_keep_alive_connections_are_closed(engine: SimHandle) -> None:
    async with running_gateway([engine], keepalive_timeout_s=1.0, header_timeout_s=30.0) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        rest = await _read_until_closed(reader, timeout_s=12)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert rest == b""  # closed without another word once idle


@pytest.mark.hostile("a flood of connections beyond any server's file descriptors")
async def test_connections_over_the_cap_get_503_and_later_ones_are_served(engine: SimHandle) -> None:
    async with running_gateway([engine], max_connections=20, header_timeout_s=30.0) as gw, aiohttp.ClientSession() as session:
        stats = gw.gateway.client_stats
        held = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(20)]

        async def all_open() -> bool:
            return stats.open == 20

        assert await wait_until(all_open, timeout_s=10)
        extra = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(10)]
        refusals = await asyncio.gather(*(_read_until_closed(reader, timeout_s=10) for reader, _ in extra))
        for _, writer in held + extra:
            writer.close()

        async def all_closed() -> bool:
            return stats.open == 0

        assert await wait_until(all_closed, timeout_s=10)
        served = await post_chat(session, gw.base_url, chat_body("after the flood", max_tokens=4, stream=False))
        metrics = await (await session.get(gw.base_url + "/metrics")).text()
    assert all(r is not None and r.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in r for r in refusals)
    assert served.status == 200 and served.body["object"] == "chat.completion"
    assert "vlmserve_gateway_client_connections_refused_total 10.0" in metrics


@pytest.mark.hostile("malformed HTTP: garbage bytes, a bad request line, an invalid header")
async def test_malformed_requests_get_400_and_one_log_line_each(engine: SimHandle, caplog: pytest.LogCaptureFixture) -> None:
    malformed = [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
        b"GET /health HTTP/1.1 extra\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: gateway\r\nBad Header Name: x\r\n\r\n",
    ]
    async with running_gateway([engine]) as gw:
        caplog.clear()
        caplog.set_level(logging.DEBUG)
        answers = []
        for raw in malformed:
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(raw)
            answers.append(await _read_until_closed(reader, timeout_s=10))
            writer.close()
        records = [r for r in caplog.records if r.name.startswith(("asyncio", "vlmserve"))]
    assert all(a is not None and a.split(b" ", 2)[1] == b"400" for a in answers), answers
    assert not any(r.exc_info for r in records) and "Traceback" not in caplog.text
    lines = [r for r in records if r.levelno >= logging.INFO]
    assert len(lines) == len(malformed) and all("malformed HTTP request" in r.getMessage() for r in lines)
    assert all("\n" not in r.getMessage() for r in lines)


@pytest.mark.hostile("plain-text traffic on the wire: the gateway serves HTTPS from --ssl-certfile/--ssl-keyfile")
async def test_https_serves_with_the_given_certificate(engine: SimHandle, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    async with running_gateway([engine], ssl_certfile=cert, ssl_keyfile=key) as gw, aiohttp.ClientSession() as session:
        assert gw.base_url.startswith("https://")
        async with session.get(gw.base_url + "/health", ssl=trust) as response:
            assert response.status == 200
        async with session.post(
            gw.base_url + "/v1/chat/completions", json=chat_body("over tls", max_tokens=4, stream=False), ssl=trust
        ) as response:
            assert response.status == 200 and (await response.json())["choices"]
        with pytest.raises(aiohttp.ClientError):
            async with session.get(gw.base_url.replace("https://", "http://") + "/health") as response:
                await response.read()
                assert response.status != 200


@pytest.mark.hostile("a missing, mismatched or garbled TLS certificate or key")
@pytest.mark.parametrize("problem", ["missing", "mismatched", "not_pem"])
def test_bad_certificate_or_key_is_a_one_line_error(tmp_path: Path, problem: str) -> None:
    cert, key = self_signed_certificate(tmp_path, "one")
    if problem == "missing":
        cert = tmp_path / "nowhere.crt"
    elif problem == "mismatched":
        key = self_signed_certificate(tmp_path, "two")[1]
    else:
        cert.write_text("not a certificate\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlmserve",
            "gateway",
            "--replica",
            "http://127.0.0.1:9",
            "--port",
            "0",
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    assert "--ssl-" in lines[0]
