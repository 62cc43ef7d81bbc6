"""walk_frames: the chunked-framing walk the relay runs on every block (upstream.py)."""

from __future__ import annotations

import pytest

from vlmserve.gateway.upstream import UpstreamClosed, UpstreamError, decode_chunked, walk_frames


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
@pytest.mark.parametrize("bad", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"f" * 2000])
def test_malformed_framing_is_an_error(bad: bytes) -> None:
    with pytest.raises(UpstreamError):
        walk_frames(bad)


@pytest.mark.hostile("a replica body cut before its last chunk: reported as incomplete, not as a whole body")
def test_a_body_without_its_last_chunk_is_incomplete() -> None:
    with pytest.raises(UpstreamClosed):
        decode_chunked(b"3\r\nabc\r\n")
