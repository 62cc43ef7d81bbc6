"""The trust boundary holds: hostile paths, admission on every engine-work route, media URLs, JSON shape.

Requests are sent as raw HTTP so that the request target reaches the gateway exactly as
written (clients such as aiohttp and httpx normalise dot segments before sending).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from PIL import Image

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway
from tests.helpers.sim import SimHandle


async def raw_request(
    base_url: str, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """Send one HTTP/1.1 request with `target` byte for byte; (status, parsed JSON body or raw bytes)."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {url.netloc}",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    payload = rest.partition(b"\r\n\r\n")[2]
    try:
        return int(status_line.split()[1]), json.loads(payload)
    except ValueError:
        return int(status_line.split()[1]), payload


def assert_openai_error(status: int, body: Any, expected_status: int) -> None:
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "\n" not in body["error"]["message"]


async def engine_state(session: aiohttp.ClientSession, engines: list[SimHandle]) -> list[tuple[Any, Any]]:
    """What a hostile request must not change: each engine's timing record and request count."""
    state = []
    for engine in engines:
        async with (
            session.get(engine.base_url + "/debug/timing") as timing,
            session.get(engine.base_url + "/debug/state") as debug,
        ):
            state.append(((await timing.json())["chunks"], (await debug.json())["requests"]))
    return state


CHAT = json.dumps(chat_body("hi", max_tokens=2, stream=False)).encode()

PATH_VARIANTS = [
    ("POST", "/v1/./chat/completions", 400, "dot segment reaches chat around admission"),
    ("POST", "/v1/x/../chat/completions", 400, "dot-dot segment reaches chat around admission"),
    ("GET", "/v1/../debug/timing?reset=1", 400, "dot-dot segment resets engine timing"),
    ("GET", "/v1/%2e%2e/debug/timing?reset=1", 400, "encoded dot-dot, lower case"),
    ("GET", "/v1/%2E%2E/debug/timing?reset=1", 400, "encoded dot-dot, upper case"),
    ("GET", "/v1/.%2e/debug/timing?reset=1", 400, "half-encoded dot-dot"),
    ("POST", "/v1%2fchat%2fcompletions", 400, "encoded slashes, lower case"),
    ("POST", "/v1%2Fchat%2Fcompletions", 400, "encoded slashes, upper case"),
    ("GET", "/v1/..%5cdebug%5Ctiming?reset=1", 400, "encoded backslashes"),
    ("GET", "/v1\\..\\debug\\timing?reset=1", 400, "backslash separators"),
    ("POST", "//v1/chat/completions", 400, "leading double slash"),
    ("POST", "/v1//chat/completions", 400, "inner double slash"),
    ("GET", "http://gateway/v1/../debug/timing?reset=1", 400, "absolute-form target with dot-dot"),
    ("GET", "/v1/../metrics", 400, "dot-dot to the engine's metrics"),
    ("GET", "/debug/timing?reset=1", 404, "engine debug path"),
    ("GET", "/debug/state", 404, "engine state path"),
    ("GET", "/docs", 404, "engine API docs"),
    ("GET", "/openapi.json", 404, "engine OpenAPI schema"),
    ("GET", "/load", 404, "engine load endpoint"),
    ("GET", "/ping", 404, "engine ping"),
    ("POST", "/reset_prefix_cache", 404, "engine prefix-cache reset"),
    ("POST", "/sleep", 404, "engine sleep"),
    ("POST", "/v1/load_lora_adapter", 404, "runtime LoRA loading"),
    ("GET", "/v1/anything-else", 404, "unknown /v1 path"),
    ("GET", "/v1/chat/completions", 405, "wrong method on a public path"),
]


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [pytest.param(m, t, s, marks=pytest.mark.hostile(f"path {why}: {t}"), id=t) for m, t, s, why in PATH_VARIANTS],
)
async def test_hostile_paths_are_refused_and_engines_untouched(
    constant_engines: list[SimHandle], method: str, target: str, status: int
) -> None:
    engines = constant_engines[:2]
    async with running_gateway(engines) as gw, aiohttp.ClientSession() as session:
        for _ in engines:  # give every engine some timing record that a reset would wipe
            assert (await post_chat(session, gw.base_url, chat_body("warm", max_tokens=4))).status == 200
        before = await engine_state(session, engines)
        answer_status, body = await raw_request(gw.base_url, method, target, CHAT if method == "POST" else b"")
        assert_openai_error(answer_status, body, status)
        assert await engine_state(session, engines) == before
        async with session.get(gw.base_url + "/health") as health:
            assert health.status == 200
        assert (await post_chat(session, gw.base_url, chat_body("still here", max_tokens=2))).status == 200


def work_bodies() -> dict[str, dict[str, Any]]:
    """A plausible body for every route that makes an engine work."""
    chat = chat_body("hello", max_tokens=2, stream=False)
    return {
        "/v1/chat/completions": chat,
        "/v1/completions": {"model": MODEL, "prompt": "hello", "max_tokens": 2},
        "/v1/responses": {"model": MODEL, "input": "hello", "max_output_tokens": 2},
        "/v1/embeddings": {"model": MODEL, "input": ["hello", "world"]},
        "/tokenize": {"model": MODEL, "prompt": "hello"},
        "/detokenize": {"model": MODEL, "tokens": [1, 2, 3]},
        "/pooling": {"model": MODEL, "input": "hello"},
        "/classify": {"model": MODEL, "input": "hello"},
        "/score": {"model": MODEL, "text_1": "a", "text_2": "b"},
        "/v1/score": {"model": MODEL, "text_1": "a", "text_2": "b"},
        "/rerank": {"model": MODEL, "query": "a", "documents": ["b"]},
        "/v1/rerank": {"model": MODEL, "query": "a", "documents": ["b"]},
        "/v2/rerank": {"model": MODEL, "query": "a", "documents": ["b"]},
    }


@pytest.mark.hostile("engine-work paths other than chat (responses, embeddings, tokenize, pooling) skip admission")
async def test_every_engine_work_route_passes_admission(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    bodies = work_bodies()
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "tenants:\n"
        + "".join(
            f"  - name: t{i}\n    keys: [sk-{i}]\n    requests_per_s: 0.01\n    burst_requests: 1\n" for i in range(len(bodies))
        )
    )
    audit = tmp_path / "audit.jsonl"
    async with running_gateway(constant_engines[:2], keys_file=keys, audit_log=audit) as gw, aiohttp.ClientSession() as session:
        for i, (path, body) in enumerate(bodies.items()):
            key = {"Authorization": f"Bearer sk-{i}"}
            first = await post_chat(session, gw.base_url, body, key, path=path)
            assert first.status not in (401, 429), (path, first.body)
            second = await post_chat(session, gw.base_url, body, key, path=path)
            assert second.status == 429 and second.body["error"]["code"] == "rate_limit_exceeded", (path, second.body)
            # Without a key the route is closed too.
            assert (await post_chat(session, gw.base_url, body, path=path)).status == 401, path
        async with session.get(gw.base_url + "/metrics") as metrics:
            text = await metrics.text()
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    for i, path in enumerate(bodies):
        mine = [r for r in records if r["tenant"] == f"t{i}"]
        assert [r["path"] for r in mine] == [path, path] and mine[1]["status"] == "429", mine
        assert f'vlmserve_gateway_shed_requests_total{{reason="rate_limited",tenant="t{i}"}} 1.0' in text
    from vlmserve.gateway.routes import ROUTES, RouteKind

    assert {r.path for r in ROUTES.values() if r.kind is RouteKind.ENGINE_WORK} == set(bodies)


@pytest.mark.hostile("/v1/models answers without an API key")
async def test_models_and_version_need_a_key(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: a\n    keys: [sk-a]\n")
    async with running_gateway(constant_engines[:2], keys_file=keys) as gw, aiohttp.ClientSession() as session:
        for path in ("/v1/models", "/version"):
            status, body = await raw_request(gw.base_url, "GET", path)
            assert_openai_error(status, body, 401)
            status, body = await raw_request(gw.base_url, "GET", path, headers={"Authorization": "Bearer sk-a"})
            assert status == 200, body
        async with session.get(gw.base_url + "/health") as health:  # the gateway's own stay open
            assert health.status == 200


def png_data_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_chat(url: str, field: str = "image_url") -> dict[str, Any]:
    part = {"type": field, field: {"url": url}}
    return chat_body(
        "", max_tokens=2, stream=False, messages=[{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    )


def assert_media_refused(result: Any, *words: str) -> None:
    assert result.status == 400, result.body
    error = result.body["error"]
    assert error["code"] == "media_url_not_allowed" and all(word in error["message"] for word in words), error


@pytest.mark.hostile("SSRF: image, video and audio URLs pointing at the engine host's loopback")
async def test_remote_media_urls_are_refused_by_default(constant_engines: list[SimHandle]) -> None:
    engines = constant_engines[:2]
    internal = f"http://127.0.0.1:{engines[0].port}"
    refused = [
        ("/v1/chat/completions", image_chat(internal + "/x.png")),
        ("/v1/chat/completions", image_chat(internal + "/v.mp4", "video_url")),
        ("/v1/chat/completions", image_chat(internal + "/a.wav", "audio_url")),
        ("/tokenize", {"model": MODEL, "messages": image_chat(internal + "/x.png")["messages"]}),
        (
            "/v1/responses",
            {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": internal + "/x.png"}]}]},
        ),
    ]
    async with running_gateway(engines) as gw, aiohttp.ClientSession() as session:
        before = await engine_state(session, engines)
        for path, body in refused:
            assert_media_refused(await post_chat(session, gw.base_url, body, path=path), "--allowed-media-domains", "data: URL")
        assert await engine_state(session, engines) == before  # nothing reached an engine
        inline = await post_chat(session, gw.base_url, image_chat(png_data_url()))
        assert inline.status == 200, inline.body


@pytest.mark.hostile("SSRF: allowlist bypass by subdomain or user-info")
async def test_only_allowlisted_hosts_pass(constant_engines: list[SimHandle]) -> None:
    async with (
        running_gateway(constant_engines[:2], allowed_media_domains=["images.example.org"]) as gw,
        aiohttp.ClientSession() as session,
    ):
        assert_media_refused(
            await post_chat(session, gw.base_url, image_chat("https://cdn.images.example.org/x.png")), "--allowed-media-domains"
        )  # subdomains do not match, as in vLLM
        assert_media_refused(
            await post_chat(session, gw.base_url, image_chat("http://images.example.org@127.0.0.1/x.png")), "user-info"
        )
        # A listed host passes the allowlist; then its addresses are checked and the gateway fetches it
        # itself. Without a network here the name does not resolve (400 naming it); with one, the fetch fails.
        allowed = await post_chat(session, gw.base_url, image_chat("https://images.example.org/x.png"))
        error = allowed.body["error"]
        assert allowed.status == 400 and "--allowed-media-domains" not in error["message"], allowed.body
        assert error["code"] == "media_fetch_failed" or "'images.example.org' does not resolve" in error["message"], error
        inline = await post_chat(session, gw.base_url, image_chat(png_data_url()))
        assert inline.status == 200, inline.body


@pytest.mark.hostile("SSRF: file:// URL to a local file as an image")
async def test_file_urls_never_pass(constant_engines: list[SimHandle]) -> None:
    async with running_gateway(constant_engines[:2]) as gw, aiohttp.ClientSession() as session:
        for url in ("file:///etc/passwd", "file://localhost/etc/passwd", "ftp://localhost/x.png"):
            assert_media_refused(await post_chat(session, gw.base_url, image_chat(url)), "data: URL")


@pytest.mark.hostile("100,000-deep nested JSON body")
async def test_deep_json_is_400_without_a_traceback(constant_engines: list[SimHandle], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_gateway(constant_engines[:2]) as gw, aiohttp.ClientSession() as session:
        for body in (
            b"[" * 100_000 + b"]" * 100_000,
            b'{"model": "sim-model", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            b"[" * 100_000,
        ):
            status, answer = await raw_request(gw.base_url, "POST", "/v1/chat/completions", body)
            assert_openai_error(status, answer, 400)
            assert answer["error"]["code"] in ("json_too_deep", "invalid_json"), answer
        assert (await post_chat(session, gw.base_url, chat_body("fine", max_tokens=2))).status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text


@pytest.mark.hostile("body of very many tiny messages (parsed JSON costs 10x+ its size)")
async def test_too_many_json_values_are_refused(constant_engines: list[SimHandle]) -> None:
    messages = [{"role": "user", "content": "x"}] * 40_000  # about 120,000 values, over the default limit
    async with running_gateway(constant_engines[:2]) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("", stream=False, messages=messages))
        assert result.status == 400 and result.body["error"]["code"] == "too_many_json_items", result.body
        assert "--max-json-items" in result.body["error"]["message"]
        ok = await post_chat(session, gw.base_url, chat_body("", stream=False, messages=messages[:100]))
        assert ok.status == 200, ok.body
