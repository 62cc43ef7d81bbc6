"""_native_head.fill_fields (C) and lean_http._fill_fields_python judge every header block alike.

The lean lane decides from these whether a request is its own or aiohttp's, on bytes an
unauthenticated client controls, so the C split is compared with the Python one on the blocks a
hostile client would send: every byte class at every place, blanks, bare CR and LF, repeated
names in other cases, long names, and many random blocks built from those pieces.
"""

from __future__ import annotations

import random
import sys

import pytest

from vlmserve.gateway import lean_http
from vlmserve.gateway.lean_http import LeanHeaders, _fill_fields_python

native = lean_http._native_head
LINE = b"POST /v1/chat/completions HTTP/1.1\r\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="setup.py builds the C parts on Linux only")
def test_the_native_split_is_built_and_used_here() -> None:
    """On Linux with a C compiler (CI, `./scripts/setup-env`) the gateway takes the C split."""
    assert native is not None, "vlmserve.gateway._native_head did not build: is a C compiler installed?"
    assert lean_http._fill_fields is native.fill_fields


needs_native = pytest.mark.skipif(native is None, reason="the C split is not built in this install "
                                  "(test_the_native_split_is_built_and_used_here says why)")


def verdicts(head: bytes) -> tuple[tuple[bool, dict[str, str]], tuple[bool, dict[str, str]]]:
    start = head.find(b"\r\n") + 2
    c_headers, py_headers = LeanHeaders(), LeanHeaders()
    c_ok = native.fill_fields(head, start, c_headers)
    py_ok = _fill_fields_python(head, start, py_headers)
    return (c_ok, dict(c_headers) if c_ok else {}), (py_ok, dict(py_headers) if py_ok else {})


ORDINARY = LINE + b"Host: 127.0.0.1:9000\r\nContent-Type: application/json\r\nAuthorization:  Bearer sk-AbC \t\r\nContent-Length: 12"


@needs_native
def test_an_ordinary_block_splits_alike_with_names_lowered_and_values_stripped() -> None:
    c, py = verdicts(ORDINARY)
    assert c == py
    assert c == (True, {"host": "127.0.0.1:9000", "content-type": "application/json",
                        "authorization": "Bearer sk-AbC", "content-length": "12"})


@needs_native
@pytest.mark.parametrize("where", ["name start", "name middle", "before colon", "value start", "value middle", "value end"])
def test_every_byte_at_every_place_gets_the_same_verdict(where: str) -> None:
    for byte in range(256):
        b = bytes([byte])
        field = {
            "name start": b + b"x-a: 1",
            "name middle": b"x-" + b + b"a: 1",
            "before colon": b"x-a" + b + b": 1",
            "value start": b"x-a:" + b + b"1",
            "value middle": b"x-a: 1" + b + b"2",
            "value end": b"x-a: 1" + b,
        }[where]
        head = LINE + b"Host: g\r\n" + field + b"\r\nContent-Length: 2"
        c, py = verdicts(head)
        assert c == py, f"byte {byte:#04x} at {where}: C {c}, Python {py}"


REFUSED = {
    "repeated name, other case": b"X-A: 1\r\nx-a: 2",
    "empty name": b": 1",
    "no colon": b"X-A 1",
    "bare LF": b"X-A: 1\nX-B: 2",
    "bare CR": b"X-A: 1\rX-B: 2",
    "CR at the end": b"X-A: 1\r",
    "empty line": b"X-A: 1\r\n\r\nX-B: 2",
    "obs-fold": b"X-A: 1\r\n continued",
    "high byte in a value": b"X-A: caf\xe9",
    "NUL in a value": b"X-A: a\x00b",
    "empty block": b"",
}


@needs_native
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_blocks_outside_the_grammar_are_refused_by_both(case: str) -> None:
    c, py = verdicts(LINE + REFUSED[case])
    assert c == py == (False, {}), case


@needs_native
def test_long_names_and_values_split_alike() -> None:
    for length in (255, 256, 257, 4000):
        head = LINE + b"X-" + b"N" * length + b":" + b" v" * length + b"\r\nContent-Length: 2"
        c, py = verdicts(head)
        assert c == py and c[0], length


PIECES = [b"X-A", b"x-a", b"Host", b"content-length", b":", b": ", b" ", b"\t", b"1", b"v", b"\r\n", b"\r", b"\n",
          b"\x00", b"\x7f", b"\xff", b"(", b"~", b"!"]


@needs_native
def test_random_blocks_from_hostile_pieces_get_the_same_verdict() -> None:
    rng = random.Random(20261128)
    accepted = 0
    for _ in range(20000):
        block = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        c, py = verdicts(LINE + block)
        assert c == py, f"block {block!r}: C {c}, Python {py}"
        accepted += c[0]
    assert accepted > 100  # the pieces make valid blocks too, so both outcomes were compared


@needs_native
def test_a_bad_argument_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="start outside the head"):
        native.fill_fields(b"abc", 9, {})
    with pytest.raises(TypeError):
        native.fill_fields("not bytes", 0, {})
