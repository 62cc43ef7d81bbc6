"""The installed vLLM's media fetcher, with the environment `vlmserve up` gives replicas, never follows a redirect.

vLLM checks `--allowed-media-domains` against the URL it is handed only; a listed host that answers
302 to an internal address would lead it there with vLLM's default (follow). This drives vLLM's own
MediaConnector (what a replica's API server uses to fetch an image URL) against a local host whose
/redirect.png points at /internal.png, with and without vlmserve's setting.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from vlmserve.engines.vllm import MEDIA_REDIRECTS_ENV
from vlmserve.vllm_flags import installed_vllm_flags

pytestmark = pytest.mark.skipif(installed_vllm_flags() is None, reason="vLLM is not installed")


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (9, 9, 9)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture()
def redirecting_host() -> Iterator[tuple[str, list[str]]]:
    """http://127.0.0.1:PORT, and the paths it served: /redirect.png answers 302 to /internal.png."""
    served: list[str] = []
    picture = _png()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            served.append(self.path)
            if self.path == "/redirect.png":
                self.send_response(302)
                self.send_header("Location", "/internal.png")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(picture)))
            self.end_headers()
            self.wfile.write(picture)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def _fetch(url: str) -> object:
    from vllm.multimodal.media.connector import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO

    return MediaConnector(allowed_media_domains=["127.0.0.1"]).load_from_url(url, ImageMediaIO())


@pytest.mark.hostile("SSRF at the engine: real vLLM media fetcher and a listed host redirecting to an internal path")
def test_vllm_with_vlmserves_env_does_not_follow_a_media_redirect(
    redirecting_host: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, served = redirecting_host
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    monkeypatch.setenv("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "1")  # vLLM's default: the control
    assert _fetch(base + "/redirect.png") is not None
    assert served == ["/redirect.png", "/internal.png"]
    served.clear()
    for name, value in MEDIA_REDIRECTS_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(Exception):  # noqa: B017 -- vLLM reports the 302's empty body as an unreadable image
        _fetch(base + "/redirect.png")
    assert served == ["/redirect.png"]  # the redirect's target was never fetched
