"""A hub id's config.json: from the cache, else fetched once with a short timeout (a local HTTP
server stands in for the hub), so the first `up` of a hub model gets the same recipe as the second."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.unit.recipes.configs import GEMMA4_31B_IT
from vlmserve.recipes.apply import choose_recipe


class _Hub(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/google/gemma-4-31B-it/resolve/main/config.json":
            body = json.dumps(GEMMA4_31B_IT).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()


def test_an_uncached_hub_id_is_fetched_once(hub: str) -> None:
    chosen = choose_recipe("google/gemma-4-31B-it")
    assert chosen.recipe is not None and chosen.recipe.family == "gemma4"
    assert chosen.basis.endswith(f"in {hub}/google/gemma-4-31B-it/resolve/main/config.json)")
    assert chosen.model_dir is None  # no local directory to find a chat template in


def test_a_refused_fetch_says_why_in_one_line(hub: str) -> None:
    chosen = choose_recipe("google/gated-model")
    assert chosen.recipe is None
    assert "fetching it failed: HTTP 401 (gated? set HF_TOKEN)" in chosen.basis


@pytest.mark.hostile("HF_ENDPOINT set to a file: URL: the config is not read from the local disk")
def test_an_endpoint_that_is_not_http_is_not_opened(hub: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "google" / "gemma-4-31B-it" / "resolve" / "main").mkdir(parents=True)
    (tmp_path / "google" / "gemma-4-31B-it" / "resolve" / "main" / "config.json").write_text(json.dumps(GEMMA4_31B_IT))
    monkeypatch.setenv("HF_ENDPOINT", f"file://{tmp_path}")
    chosen = choose_recipe("google/gemma-4-31B-it")
    assert chosen.recipe is None and "is not an http(s) URL" in chosen.basis
