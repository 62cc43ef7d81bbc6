"""Hostile clients against a real sim engine (subprocess): invalid Unicode, and a reader that stalls.

Invalid Unicode is a 400 in OpenAI's error format on every JSON route, never a plain-text
500. A client that stops reading a long stream must not make the engine hold the stream
in memory: its RSS stays within a bound while the stream is produced, and the stream is
still whole when the client reads it.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import psutil
import pytest

from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "sim-hostile"
RSS_GROWTH_LIMIT_MB = 32.0
"""Allowed engine growth while two clients hold 250,000-token streams unread (~45 MB of SSE each)."""


@pytest.fixture(scope="module")
def engine():
    with start_sim_engine(model=MODEL, ttft_ms=1, itl_ms=1) as handle:
        yield handle


def _body(path: str, text: str) -> str:
    if path == "/v1/chat/completions":
        return '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "%s"}]}' % (MODEL, text)
    return '{"model": "%s", "max_tokens": 2, "prompt": "%s"}' % (MODEL, text)


def _assert_openai_400(response: httpx.Response, wording: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert wording in error["message"] and "\n" not in error["message"]


ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize"]


@pytest.mark.hostile("sim engine: a lone surrogate escape (\\ud800) in a JSON string; 400 in OpenAI format")
@pytest.mark.parametrize("path", ROUTES)
def test_lone_surrogate_escape_is_a_400(engine, path: str) -> None:
    for text in ("a\\ud800b", "\\udfff", "high then low reversed \\ude00\\ud83d"):
        response = httpx.post(
            engine.base_url + path, content=_body(path, text).encode(), headers={"Content-Type": "application/json"}, timeout=10
        )
        _assert_openai_400(response, "lone UTF-16 surrogate")
    paired = httpx.post(
        engine.base_url + path,
        content=_body(path, "emoji \\ud83d\\ude00 and \\\\ud800").encode(),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert paired.status_code == 200, paired.text  # a valid pair, and an escaped backslash, are fine


@pytest.mark.hostile("sim engine: raw invalid UTF-8 bytes (an encoded surrogate, 0xff) in the body; 400 in OpenAI format")
@pytest.mark.parametrize("path", ROUTES)
def test_invalid_utf8_bytes_are_a_400(engine, path: str) -> None:
    for raw in (b"\xed\xa0\x80", b"\xff\xfe", b"\xc3"):
        body = _body(path, "x").encode().replace(b'"x"', b'"' + raw + b'"')
        response = httpx.post(engine.base_url + path, content=body, headers={"Content-Type": "application/json"}, timeout=10)
        _assert_openai_400(response, "not valid UTF-8")


def _open_unread_stream(port: int, tokens: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(
        {"model": MODEL, "prompt": "a long story", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    ).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def _finished_requests(handle: SimHandle) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in handle.metrics_text().splitlines()
        if line.startswith("vllm:request_success_total")
    )


def _read_to_end(sock: socket.socket) -> bytes:
    received = bytearray()
    sock.settimeout(60)
    while not received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
        chunk = sock.recv(1 << 16)
        assert chunk, "the stream ended early"
        received += chunk
    return bytes(received)


@pytest.mark.hostile("sim engine: clients stop reading long streams; engine memory stays bounded, streams stay whole")
def test_slow_reader_does_not_grow_the_engine() -> None:
    tokens, clients = 250_000, 2
    with start_sim_engine(
        model=MODEL,
        ttft_ms=1,
        itl_ms=0.01,
        max_model_len=tokens + 1000,
        num_kv_blocks=clients * (tokens + 1000) // 16 + 64,
        no_timing=True,
    ) as fast:
        process = psutil.Process(fast.pid)
        before = process.memory_info().rss
        sockets = [_open_unread_stream(fast.port, tokens) for _ in range(clients)]
        try:
            peak = before
            deadline = time.monotonic() + 120
            while _finished_requests(fast) < clients:  # the engine has produced every token
                assert time.monotonic() < deadline, "the engine did not finish the streams"
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.1)
            peak = max(peak, process.memory_info().rss)
            growth_mb = (peak - before) / 2**20
            assert growth_mb < RSS_GROWTH_LIMIT_MB, f"the engine grew {growth_mb:.0f} MB for {clients} unread streams"
            streams = [_read_to_end(sock) for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
    for stream in streams:
        assert stream.count(b"data: ") == tokens + 1  # every token's event, then [DONE]
