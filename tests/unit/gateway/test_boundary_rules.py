"""The trust boundary's pure rules: path checks, media URLs, JSON shape (no server needed)."""

from __future__ import annotations

import pytest

from vlmserve.gateway.json_limits import JsonShapeRefused, check_json_shape
from vlmserve.gateway.routes import RouteRefused, find_route, target_path
from vlmserve.media.urls import MediaRefused, allowed_host_set, check_media


@pytest.mark.parametrize(
    "target",
    ["/v1/./x", "/v1/../x", "/v1/%2E%2e/x", "/a%2fb", "/a%5Cb", "/a\\b", "//a", "/a//b", "/a#b", "ftp://h/x", "http://h/v1/../x"],
)
def test_non_canonical_targets_are_400(target: str) -> None:
    with pytest.raises(RouteRefused) as refused:
        target_path(target)
    assert refused.value.status == 400


def test_canonical_targets_and_lookup() -> None:
    assert target_path("/v1/chat/completions?x=1") == "/v1/chat/completions"
    assert target_path("http://gw:8000/v1/models") == "/v1/models"
    assert find_route("/v1/responses", "POST").generates
    assert find_route("/v1/models", "HEAD").path == "/v1/models"
    for path, method, status in (("/metrics/", "GET", 404), ("/debug/timing", "GET", 404), ("/tokenize", "GET", 405)):
        with pytest.raises(RouteRefused) as refused:
            find_route(path, method)
        assert refused.value.status == status


def chat_with(url: str) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}


def test_media_policy() -> None:
    allowed = allowed_host_set(["Images.Example.org", "[::1]"])
    for url in (
        "data:image/png;base64,AAAA",
        "https://images.example.org/a.png",
        "HTTP://IMAGES.EXAMPLE.ORG:8080/a",
        "http://[::1]/a.png",
    ):
        check_media(chat_with(url), allowed)
    for url in (
        "http://127.0.0.1/a.png",
        "https://x.images.example.org/a",
        "https://images.example.org.evil.com/a",
        "http://u@images.example.org/a",
        "http://images.example.org\\@evil/a",
        "file:///etc/passwd",
        "gopher://images.example.org/",
        "//images.example.org/a",
        "http://images.example.org:99999/a",
    ):
        with pytest.raises(MediaRefused):
            check_media(chat_with(url), allowed)
    with pytest.raises(MediaRefused):  # /v1/responses input items, string form
        check_media({"input": [{"content": [{"type": "input_image", "image_url": "http://10.0.0.1/x"}]}]}, allowed)


def test_json_shape() -> None:
    check_json_shape(b'{"a": "[[[[\\"]]]]", "b": [[1, 2], {"c": "\\\\"}]}', max_depth=3, max_items=10)
    for body, code in (
        (b"[" * 5 + b"]" * 5, "json_too_deep"),
        (b"[" + b"1," * 20 + b"1]", "too_many_json_items"),
        (b'["' + b'",",' * 20 + b'"]', "too_many_json_items"),
        (b"[[]", "invalid_json"),
    ):
        with pytest.raises(JsonShapeRefused) as refused:
            check_json_shape(body, max_depth=4, max_items=10)
        assert refused.value.code == code, body


def test_trace_context_is_forwarded_only_when_well_formed() -> None:
    from vlmserve.gateway.proxy import trace_context

    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert trace_context({"traceparent": parent, "tracestate": "vendor=1"}) == {"traceparent": parent, "tracestate": "vendor=1"}
    assert trace_context({"traceparent": parent + "\r\nX-Evil: 1"}) == {}
    assert trace_context({"traceparent": "00-xyz"}) == {}
    assert trace_context({"traceparent": parent, "tracestate": "x" * 600}) == {"traceparent": parent}
    assert trace_context({}) == {}
