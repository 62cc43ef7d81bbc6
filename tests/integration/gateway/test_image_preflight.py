"""Image preflight at the gateway: limits on the header, remote images fetched and inlined, downscaling, the audit."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from PIL import Image

from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway
from tests.helpers.image_bombs import ico_holding_png, one_bit_png
from tests.helpers.sim import SimHandle


def png_bytes(width: int, height: int, image_format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, height % 256, 7)).save(buffer, format=image_format)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def bomb_png(width: int, height: int) -> bytes:
    """A PNG header claiming width x height over a few bytes of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def image_request(*urls: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    parts.append({"type": "text", "text": "what is in the picture?"})
    return chat_body("", max_tokens=2, stream=stream, messages=[{"role": "user", "content": parts}], **extra)


def assert_refused(result: Any, code: str, *words: str) -> None:
    assert result.status == 400, result.body
    error = result.body["error"]
    assert error["code"] == code and "\n" not in error["message"], error
    assert all(word in error["message"] for word in words), error


def _serve_bytes(body: bytes) -> Any:
    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="image/png")

    return handler


@asynccontextmanager
async def image_host(routes: dict[str, Any]) -> AsyncIterator[str]:
    """A local HTTP server answering `routes` (path -> bytes, or a handler): the 'remote' image host."""
    app = web.Application()
    for path, answer in routes.items():
        app.router.add_get(path, answer if callable(answer) else _serve_bytes(answer))
    # the /hang.png handler never ends by itself: at exit, cancel it after 1 s rather than wait out
    # aiohttp's 60 s default (or the handler's sleep)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.hostile("image over the gateway's max pixels (and a decompression bomb header)")
async def test_limits_are_checked_on_the_header(constant_engines: list[SimHandle]) -> None:
    async with running_gateway(constant_engines[:1], max_image_pixels=10_000) as gw, aiohttp.ClientSession() as session:
        assert_refused(
            await post_chat(session, gw.base_url, image_request(data_url(png_bytes(200, 100)))),
            "image_too_large",
            "200x100 = 20000 pixels",
            "10000-pixel limit",
            "--max-image-pixels",
        )
        assert_refused(
            await post_chat(session, gw.base_url, image_request(data_url(bomb_png(60_000, 60_000)))),
            "image_too_large",
            "decompression bomb",
            "--max-image-pixels",
        )
        ok = await post_chat(session, gw.base_url, image_request(data_url(png_bytes(100, 100))))
        assert ok.status == 200, ok.body


@pytest.mark.hostile("oversized, undecodable, non-base64 and too many images")
async def test_bad_images_get_one_line_400s(constant_engines: list[SimHandle]) -> None:
    async with (
        running_gateway(constant_engines[:1], max_image_bytes=50_000, max_images_per_request=2) as gw,
        aiohttp.ClientSession() as session,
    ):
        big = data_url(bytes(60_000))  # the size is checked before anything is decoded
        assert_refused(await post_chat(session, gw.base_url, image_request(big)), "image_too_large", "--max-image-bytes")
        assert_refused(
            await post_chat(session, gw.base_url, image_request(data_url(b"hello, not an image"))),
            "invalid_image",
            "image 1",
            "not a readable image",
        )
        assert_refused(
            await post_chat(session, gw.base_url, image_request("data:image/png;base64,@@@@")), "invalid_image", "base64"
        )
        small = data_url(png_bytes(8, 8))
        assert_refused(
            await post_chat(session, gw.base_url, image_request(small, small, small)),
            "too_many_images",
            "3 images",
            "--max-images-per-request",
        )
        assert (await post_chat(session, gw.base_url, image_request(small, small))).status == 200


async def test_a_tenant_may_tighten_the_limits(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "tenants:\n  - name: kiosk\n    keys: [sk-kiosk]\n    max_image_pixels: 1000\n"
        "  - name: clinic\n    keys: [sk-clinic]\n    max_image_pixels: 999999999\n"
    )
    image = image_request(data_url(png_bytes(64, 64)))
    async with (
        running_gateway(constant_engines[:1], keys_file=keys, max_image_pixels=5000) as gw,
        aiohttp.ClientSession() as session,
    ):
        kiosk = await post_chat(session, gw.base_url, image, headers={"Authorization": "Bearer sk-kiosk"})
        assert_refused(kiosk, "image_too_large", "1000-pixel limit")
        clinic = await post_chat(session, gw.base_url, image, headers={"Authorization": "Bearer sk-clinic"})
        assert clinic.status == 200, clinic.body  # 4096 pixels: under the gateway's 5000
        huge = await post_chat(
            session, gw.base_url, image_request(data_url(png_bytes(100, 100))), headers={"Authorization": "Bearer sk-clinic"}
        )
        assert_refused(huge, "image_too_large", "5000-pixel limit")  # a tenant cannot loosen the gateway's


async def test_remote_images_are_fetched_and_forwarded_inline(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    picture = png_bytes(32, 16)
    audit = tmp_path / "audit.jsonl"
    async with (
        image_host({"/x.png": picture}) as host,
        running_gateway(
            constant_engines[:1], allowed_media_domains=["127.0.0.1"], allow_internal_media_addresses=True, audit_log=audit
        ) as gw,
        aiohttp.ClientSession() as session,
    ):
        fetched = await post_chat(session, gw.base_url, image_request(host + "/x.png"))
        assert fetched.status == 200, fetched.body
        inline = await post_chat(session, gw.base_url, image_request(data_url(picture)))
        assert inline.status == 200
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert records[0]["images"][0]["source"] == "fetched" and records[1]["images"][0]["source"] == "inline"
    # the same bytes give the same digest whatever carried them
    assert records[0]["images"][0]["digest"] == records[1]["images"][0]["digest"]
    assert fetched.body["usage"]["prompt_tokens"] == inline.body["usage"]["prompt_tokens"]


@pytest.mark.hostile("remote image host that hangs, redirects, sends too much or is gone")
async def test_remote_fetch_failures_are_bounded(constant_engines: list[SimHandle]) -> None:
    async def hang(_request: web.Request) -> web.Response:
        await asyncio.sleep(3600)  # never answers; cancelled when the host stops
        return web.Response(body=b"")

    async def redirect(_request: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data")

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            for _ in range(1000):
                await response.write(b"\x00" * 65536)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the gateway hung up at its size cap: what this host is here to show
        return response

    async with (
        image_host({"/hang.png": hang, "/redirect.png": redirect, "/endless.png": endless}) as host,
        running_gateway(
            constant_engines[:1],
            allowed_media_domains=["127.0.0.1"],
            allow_internal_media_addresses=True,
            media_fetch_timeout_s=0.5,
            max_image_bytes=1_000_000,
        ) as gw,
        aiohttp.ClientSession() as session,
    ):
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert_refused(
            await post_chat(session, gw.base_url, image_request(host + "/hang.png")),
            "media_fetch_failed",
            "did not answer within 0.5 s",
            "--media-fetch-timeout",
        )
        assert loop.time() - started < 10
        assert_refused(
            await post_chat(session, gw.base_url, image_request(host + "/redirect.png")),
            "media_fetch_failed",
            "HTTP 302",
            "redirect",
        )
        assert_refused(
            await post_chat(session, gw.base_url, image_request(host + "/endless.png")),
            "image_too_large",
            "more than",
            "--max-image-bytes",
        )
        assert_refused(
            await post_chat(session, gw.base_url, image_request(host + "/missing.png")), "media_fetch_failed", "HTTP 404"
        )
        gone = host.rsplit(":", 1)[0] + ":1/x.png"
        assert_refused(await post_chat(session, gw.base_url, image_request(gone)), "media_fetch_failed", "failed")


async def test_downscale_resizes_and_the_audit_records_both_sizes(constant_engines: list[SimHandle], tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    photo = png_bytes(640, 480, "JPEG")
    async with (
        running_gateway(constant_engines[:1], image_downscale_max_side=128, audit_log=audit) as gw,
        aiohttp.ClientSession() as session,
    ):
        result = await post_chat(session, gw.base_url, image_request(data_url(photo, "image/jpeg")))
        assert result.status == 200, result.body
    image = json.loads(audit.read_text().splitlines()[0])["images"][0]
    assert image["size"] == "640x480" and image["sent_size"] == "128x96" and image["format"] == "jpeg"
    assert image["sent_bytes"] < image["bytes"]


@pytest.mark.hostile("per-request mm_processor_kwargs that multiply an engine's preprocessing work")
async def test_clients_may_send_only_the_allowed_processor_kwargs(constant_engines: list[SimHandle]) -> None:
    image = data_url(png_bytes(8, 8))
    async with running_gateway(constant_engines[:1]) as gw, aiohttp.ClientSession() as session:
        assert_refused(
            await post_chat(session, gw.base_url, image_request(image, mm_processor_kwargs={"size": {"longest_edge": 99999}})),
            "mm_processor_kwargs_not_allowed",
            "'size'",
            "--client-mm-processor-kwargs",
        )
        assert_refused(
            await post_chat(session, gw.base_url, image_request(image, mm_processor_kwargs="big")),
            "invalid_mm_processor_kwargs",
            "must be an object",
        )
        assert_refused(
            await post_chat(session, gw.base_url, image_request(image, media_io_kwargs={"video": {"num_frames": 10**6}})),
            "mm_processor_kwargs_not_allowed",
            "media_io_kwargs",
        )
        budget = await post_chat(session, gw.base_url, image_request(image, mm_processor_kwargs={"max_soft_tokens": 70}))
        assert budget.status == 200, budget.body


async def test_image_metrics_count_outcomes(constant_engines: list[SimHandle]) -> None:
    async with (
        running_gateway(constant_engines[:1], image_downscale_max_side=16, max_image_pixels=5000) as gw,
        aiohttp.ClientSession() as session,
    ):
        assert (await post_chat(session, gw.base_url, image_request(data_url(png_bytes(32, 32))))).status == 200
        assert (await post_chat(session, gw.base_url, image_request(data_url(png_bytes(100, 100))))).status == 400
        async with session.get(gw.base_url + "/metrics") as response:
            text = await response.text()
    assert 'vlmserve_gateway_images_total{outcome="inline"} 1.0' in text
    assert 'vlmserve_gateway_images_total{outcome="downscaled"} 1.0' in text
    assert 'vlmserve_gateway_images_total{outcome="image_too_large"} 1.0' in text
    assert "vlmserve_gateway_image_preflight_seconds_count 1.0" in text


# ---- image work off the event loop (media/workers.py) ------------------------------------------


@pytest.mark.hostile("a 12000x12000 ICO (Pillow's ICO reader decodes at open): refused unread, on default settings")
async def test_an_ico_is_refused_without_being_decoded(constant_engines: list[SimHandle]) -> None:
    async with running_gateway(constant_engines[:1]) as gw, aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, image_request(data_url(ico_holding_png(12000, 12000), "image/x-icon")))
    # had the probe opened it, its 144-megapixel PNG would have been decoded, then refused as too large
    assert_refused(result, "invalid_image", "image 1", "not a readable image", "ICO", "send a PNG")


async def _health_answered_while_posting(base_url: str, body: dict[str, Any]) -> tuple[int, float, float | None]:
    """POST `body` on a raw connection and, once it is written, poll /health. Returns the POST's status,
    when it was answered, and when the first /health answer came (loop time; None if none)."""
    loop = asyncio.get_running_loop()
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload
    )
    await writer.drain()
    await asyncio.sleep(0.3)  # the gateway has the request and is working on its images
    health_at: list[float] = []

    async def poll_health() -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(base_url + "/health") as response:
                    assert response.status == 200
                    health_at.append(loop.time())
                await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll_health())
    try:
        answer = await asyncio.wait_for(reader.read(), 120)
        answered_at = loop.time()
    finally:
        poller.cancel()
        writer.close()
    return int(answer.split(b" ", 2)[1]), answered_at, (health_at[0] if health_at else None)


@pytest.mark.hostile("PNG bombs (7.8 KB 1-bit 8000x8000) with downscaling on: /health is answered while they are resized")
async def test_health_is_answered_while_png_bombs_are_downscaled(constant_engines: list[SimHandle]) -> None:
    bomb = data_url(one_bit_png(8000, 8000))
    # four bombs, then an image that is refused: the request ends as soon as its images are done with
    body = image_request(bomb, bomb, bomb, bomb, data_url(b"not an image"), stream=False)
    async with running_gateway(constant_engines[:1], image_downscale_max_side=512) as gw:
        status, answered_at, health_at = await _health_answered_while_posting(gw.base_url, body)
    assert status == 400
    assert health_at is not None and health_at < answered_at, "no /health answer while the images were worked on"


@pytest.mark.hostile("images that take longer to downscale than the request's budget: 400, and the next request is served")
async def test_image_work_over_the_budget_is_refused(constant_engines: list[SimHandle]) -> None:
    bomb = data_url(one_bit_png(8000, 8000))
    async with (
        running_gateway(constant_engines[:1], image_downscale_max_side=256, image_work_budget_s=0.3, image_workers=1) as gw,
        aiohttp.ClientSession() as session,
    ):
        result = await post_chat(session, gw.base_url, image_request(bomb, bomb, stream=False))
        assert_refused(result, "image_work_over_budget", "0.3 s CPU budget", "--image-work-budget")
        assert gw.gateway.preflight.pool is not None and gw.gateway.preflight.pool.killed == 1
        ok = await post_chat(session, gw.base_url, image_request(data_url(png_bytes(600, 300)), stream=False))
        assert ok.status == 200, ok.body  # a fresh worker took the killed one's place


@pytest.mark.hostile("more image requests than the workers and their queue hold: 503 with Retry-After, the pool never grows")
async def test_a_full_image_pool_refuses_with_503(constant_engines: list[SimHandle]) -> None:
    bomb = data_url(one_bit_png(8000, 8000))
    async with (
        running_gateway(constant_engines[:1], image_downscale_max_side=256, image_work_budget_s=2.0, image_workers=1) as gw,
        aiohttp.ClientSession() as session,
    ):
        pool = gw.gateway.preflight.pool
        assert pool is not None
        results = await asyncio.gather(
            *[post_chat(session, gw.base_url, image_request(bomb, stream=False)) for _ in range(pool.queue_limit + 3)]
        )
    busy = [r for r in results if r.status == 503]
    assert busy and all(r.body["error"]["code"] == "image_workers_busy" and r.headers["Retry-After"] == "1" for r in busy)
    assert {r.status for r in results} <= {200, 400, 503}
    assert len(pool._idle) <= 1


@pytest.mark.hostile("a client that leaves while its PNG bomb is resized: the worker is stopped, its slot freed")
async def test_a_client_leaving_mid_resize_frees_the_worker(constant_engines: list[SimHandle]) -> None:
    payload = json.dumps(image_request(data_url(one_bit_png(8000, 8000)), stream=False)).encode()
    async with (
        running_gateway(constant_engines[:1], image_downscale_max_side=256, image_workers=1) as gw,
        aiohttp.ClientSession() as session,
    ):
        pool = gw.gateway.preflight.pool
        assert pool is not None
        _, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
        await writer.drain()
        await asyncio.sleep(0.3)
        assert pool._busy == 1  # the bomb is in the worker
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # gone, with a reset (a plain close is a half-close: the answer is still made)
        for _ in range(100):
            if pool.killed == 1 and pool._busy == 0:
                break
            await asyncio.sleep(0.05)
        assert pool.killed == 1 and pool._busy == 0
        ok = await post_chat(session, gw.base_url, image_request(data_url(png_bytes(600, 300)), stream=False))
        assert ok.status == 200, ok.body
