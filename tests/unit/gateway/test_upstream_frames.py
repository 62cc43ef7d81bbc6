"""walk_frames: the chunked-framing walk the relay runs on every block, and the response head parse (upstream.py)."""

from __future__ import annotations

import re

import pytest

from vlmserve.gateway.upstream import UpstreamClosed, UpstreamConnection, UpstreamError, decode_chunked, walk_frames


def test_whole_frames_pass_and_the_end_is_found() -> None:
    body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    payload: list[bytes] = []
    boundary, end = walk_frames(body, payload)
    assert (boundary, end) == (body.index(b"0\r\n\r\n"), len(body))
    assert b"".join(payload) == b"hello world"
    assert decode_chunked(body) == b"hello world"


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 9])
def test_an_incomplete_frame_is_held_back(cut: int) -> None:
    block = b"3\r\nabc\r\n5\r\nhello\r\n"
    boundary, end = walk_frames(block[: 8 + cut])
    assert (boundary, end) == (8, -1)  # only "3\r\nabc\r\n" may go out


def test_trailers_and_a_split_terminator() -> None:
    assert walk_frames(b"0\r\n") == (0, -1)
    assert walk_frames(b"0\r\nX-Trailer: 1\r\n") == (0, -1)
    assert walk_frames(b"0\r\nX-Trailer: 1\r\n\r\n") == (0, 19)


@pytest.mark.hostile("replica chunk framing: a size that is not hex, a frame without its CRLF, an endless size line: an error")
@pytest.mark.parametrize("bad", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"f" * 2000, b"0x3\r\nabc\r\n", b"+3\r\nabc\r\n",
                                 b"1_0\r\n" + b"a" * 16 + b"\r\n", b"-3\r\nabc\r\n", b"f" * 16 + b"\r\n"])
def test_malformed_framing_is_an_error(bad: bytes) -> None:
    with pytest.raises(UpstreamError):
        walk_frames(bad)


@pytest.mark.hostile("a replica body cut before its last chunk: reported as incomplete, not as a whole body")
def test_a_body_without_its_last_chunk_is_incomplete() -> None:
    with pytest.raises(UpstreamClosed):
        decode_chunked(b"3\r\nabc\r\n")


def _head(raw: bytes) -> UpstreamConnection:
    connection = UpstreamConnection(("http", "127.0.0.1", 1))
    connection._parse_head(raw)
    return connection


def test_a_response_head_is_read_as_sent() -> None:
    """Names lower-cased, values stripped of ASCII spaces only (a latin-1 NBSP is part of the value),
    repeated fields joined, HTTP/1.0 noticed (its connection is not kept alive)."""
    connection = _head(b"HTTP/1.0 200 OK\r\nContent-Type : text/event-stream \r\nX-A: 1\r\nx-a: 2\r\nX-Nbsp: v\xa0")
    assert connection.status == 200 and connection.http10
    assert connection.headers == {"content-type": "text/event-stream", "x-a": "1, 2", "x-nbsp": "v\xa0"}
    assert not _head(b"HTTP/1.1 204 No Content").http10


@pytest.mark.parametrize("raw, message", [
    (b"HTTP/1.1 2\xb20 OK", "not an HTTP/1.1 response: b'HTTP/1.1 2\\xb20 OK'"),  # a latin-1 superscript digit
    (b"SIP/2.0 200 OK", "not an HTTP/1.1 response"),
    (b"HTTP/1.1 200 OK\r\nno colon here", "malformed response header line b'no colon here'"),
    (b"HTTP/1.1 101 Switching Protocols", "unexpected informational response 101"),
])
def test_a_malformed_response_head_is_refused(raw: bytes, message: str) -> None:
    with pytest.raises(UpstreamError, match="^" + re.escape(message)):
        _head(raw)
