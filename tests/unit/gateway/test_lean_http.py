"""lean_http.parse_head: exactly the plain requests are lean; everything doubtful is not (it goes to aiohttp)."""

from __future__ import annotations

import time

import pytest

from vlmserve.gateway.lean_http import MAX_HEAD_BYTES, LeanHeaders, _fill_fields, first_line_fits, parse_head, response_head

LINE = b"POST /v1/chat/completions HTTP/1.1"


def test_a_plain_head_is_lean_with_case_insensitive_headers() -> None:
    head = parse_head(LINE + b"\r\nHost: g\r\nAuthorization:  Bearer k \r\nContent-Length: 12", max_body_bytes=100)
    assert head is not None and head.content_length == 12 and head.route.path == "/v1/chat/completions"
    assert head.headers.get("authorization") == head.headers.get("AUTHORIZATION") == "Bearer k"
    assert head.headers.get("X-Missing", "none") == "none"


NOT_LEAN = {
    "GET": b"GET /v1/chat/completions HTTP/1.1\r\nContent-Length: 2",
    "HTTP/1.0": b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2",
    "lower-case method": b"post /v1/chat/completions HTTP/1.1\r\nContent-Length: 2",
    "not engine work": b"POST /health HTTP/1.1\r\nContent-Length: 2",
    "query": b"POST /v1/chat/completions?a=1 HTTP/1.1\r\nContent-Length: 2",
    "percent-encoding": b"POST /v1/chat/%63ompletions HTTP/1.1\r\nContent-Length: 2",
    "absolute form": b"POST http://g/v1/chat/completions HTTP/1.1\r\nContent-Length: 2",
    "no length": LINE + b"\r\nHost: g",
    "signed length": LINE + b"\r\nContent-Length: +2",
    "hex length": LINE + b"\r\nContent-Length: 0x2",
    "two lengths": LINE + b"\r\nContent-Length: 2\r\nContent-Length: 2",
    "same header twice, other case": LINE + b"\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 2",
    "transfer-encoding": LINE + b"\r\nTransfer-Encoding: chunked\r\nContent-Length: 2",
    "expect": LINE + b"\r\nExpect: 100-continue\r\nContent-Length: 2",
    "upgrade": LINE + b"\r\nUpgrade: websocket\r\nContent-Length: 2",
    "connection upgrade": LINE + b"\r\nConnection: upgrade\r\nContent-Length: 2",
    "space before colon": LINE + b"\r\nHost : g\r\nContent-Length: 2",
    "obs-fold": LINE + b"\r\nX-A: 1\r\n  continued\r\nContent-Length: 2",
    "bare LF": LINE + b"\r\nX-A: 1\nContent-Length: 2",
    "bare CR": LINE + b"\r\nX-A: 1\rX-B: 2\r\nContent-Length: 2",
    "NUL in a value": LINE + b"\r\nX-A: 1\x002\r\nContent-Length: 2",
    "non-ASCII value": LINE + b"\r\nX-A: caf\xc3\xa9\r\nContent-Length: 2",
    "empty name": LINE + b"\r\n: x\r\nContent-Length: 2",
    "a line that is no field": LINE + b"\r\nX-A: 1\r\ngarbage\r\nContent-Length: 2",
    "a field after junk": LINE + b"\r\n\x01X-A: 1\r\nContent-Length: 2",
    "over the body limit": LINE + b"\r\nContent-Length: 101",
}


@pytest.mark.hostile("request heads outside the lean subset: smuggling shapes, folds, bare line ends, odd lengths")
@pytest.mark.parametrize("case", sorted(NOT_LEAN))
def test_doubtful_heads_are_not_lean(case: str) -> None:
    assert parse_head(NOT_LEAN[case], max_body_bytes=100) is None


# Header blocks built to make a regular expression backtrack, or retry from every character.
# 64 KB, past the lane's own head limit: parse_head must be linear even in what it is never given.
PATHOLOGICAL = {
    "blanks and tabs, then NUL": LINE + b"\r\nX-A: a" + b" \t" * 32000 + b"\x00\r\nContent-Length: 2",
    "one run of token characters": LINE + b"\r\n" + b"a" * 64000,
    "colons only": LINE + b"\r\n" + b":" * 64000,
    "bare-LF lines": LINE + b"\r\n" + b"a:\n" * 21000,
}


@pytest.mark.hostile("header blocks built to make a regular expression backtrack or retry from every character")
@pytest.mark.parametrize("case", sorted(PATHOLOGICAL))
def test_a_pathological_header_is_refused_in_linear_time(case: str) -> None:
    started = time.perf_counter()
    head = PATHOLOGICAL[case]
    # the field pass itself (parse_head refuses a head this long before it): linear in any block
    assert not _fill_fields(head, head.find(b"\r\n") + 2, LeanHeaders())
    # a DoS guard, not a speed figure (benchmarks/lean_head_parse.py has those): a quadratic pass
    # over 64 KB takes 20 s or more here, a linear one about a millisecond
    assert time.perf_counter() - started < 2.0


def test_the_first_line_decides_early() -> None:
    assert first_line_fits(LINE)
    assert not first_line_fits(b"GET /health HTTP/1.1")
    assert not first_line_fits(b"POST /v1/models HTTP/1.1")


def test_response_head_names_the_status_and_length() -> None:
    head = bytes(response_head(429, [("Retry-After", "1")], length=5, close=True))
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 5\r\nConnection: close\r\n")
    assert head.endswith(b"\r\n\r\n") and b"Date: " in head


def test_connection_close_is_lean_and_marks_the_last_request() -> None:
    head = parse_head(LINE + b"\r\nConnection: Close\r\nContent-Length: 2", max_body_bytes=100)
    assert head is not None and head.close
    kept = parse_head(LINE + b"\r\nConnection: keep-alive\r\nContent-Length: 2", max_body_bytes=100)
    assert kept is not None and not kept.close


@pytest.mark.hostile("a request head just over the lean lane's limit: judged by aiohttp's limits however it arrives")
def test_a_head_over_the_limit_is_never_lean() -> None:
    start = LINE + b"\r\nContent-Length: 2\r\nX-Pad: "
    at_limit = start + b"p" * (MAX_HEAD_BYTES - len(start))
    assert len(at_limit) == MAX_HEAD_BYTES and parse_head(at_limit, max_body_bytes=100) is not None
    assert parse_head(at_limit + b"p", max_body_bytes=100) is None
