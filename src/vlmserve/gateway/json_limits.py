"""Cheap checks of a JSON body's shape, run on the raw bytes before `json.loads`.

The rules this module keeps:
- Nesting deeper than `max_depth` is refused before any parser sees it, so no parser can
  recurse out of stack (a 100,000-deep array used to raise RecursionError in `json.loads`).
- At most `max_items` JSON containers and elements (counted as `{`, `[` and `,` outside
  strings) are parsed. Parsed JSON costs tens to hundreds of bytes of Python objects per
  value, so this bounds the gateway's memory for one request by its body size plus a fixed
  amount (`max_items` small objects), however the body is shaped.
- The scan is linear and bounded in time and memory: C-speed replaces drop escapes, the
  quote count bounds the strings (refused before they are split off), slicing or one split
  removes strings, and the depth walk is a Python loop over at most 2 * `max_items` bracket bytes.
  At most two copies of the body live at once. Nothing here recurses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# the C scanner json.loads ends in (typeshed does not declare the attribute)
_SCAN_VALUE: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_ALL_BYTES = bytes(range(256))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = frozenset(b"[{")


class JsonShapeRefused(Exception):
    """The body is too deep, too big in values, or unbalanced; the message says what to change."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _too_many(items: int, max_items: int) -> JsonShapeRefused:
    return JsonShapeRefused(
        f"request body has about {items} JSON values, over the {max_items} limit: split the request "
        "(fewer messages or inputs) or ask the operator to raise --max-json-items", "too_many_json_items")


def _outside_strings(cleaned: bytes, quotes: int) -> bytes:
    """The bytes outside strings. Few strings: slice around them (a long string, such as an
    inline image, is never copied); many: one split (half the memory of a regex sub)."""
    if quotes > 4096:
        return b"".join(cleaned.split(b'"')[0::2])
    pieces: list[bytes] = []
    position = 0
    while True:
        start = cleaned.find(b'"', position)
        if start < 0:
            pieces.append(cleaned[position:])
            break
        pieces.append(cleaned[position:start])
        end = cleaned.find(b'"', start + 1)
        if end < 0:  # an unterminated string runs to the end (json.loads will refuse the body)
            break
        position = end + 1
    return b"".join(pieces)


def loads_body(body: bytes) -> Any:
    """`json.loads(body)`, with the common body (a UTF-8 object with nothing around it) handed
    straight to the C scanner: json.loads first runs five Python-level steps (encoding detection,
    decode, two whitespace matches, raw_decode) that cost more than scanning a small body. Any
    other body, and every error, goes through json.loads itself, so results and messages are its."""
    if body[:1] == b"{" and body[-1:] == b"}" and body[1:2] != b"\x00":  # json.loads would decode it as UTF-8
        try:
            text = body.decode("utf-8", "surrogatepass")
            value, end = _SCAN_VALUE(text, 0)
        except (UnicodeDecodeError, StopIteration, ValueError):
            pass  # json.loads below says what is wrong
        else:
            if end == len(text):
                return value
    return json.loads(body)


def check_json_shape(body: bytes, *, max_depth: int, max_items: int) -> None:
    """Raise JsonShapeRefused if `body` nests deeper than max_depth or holds over max_items values."""
    # The common small body: counts over the raw bytes (strings included) bound the counts outside
    # strings, so when even they are within the limits nothing can be over them. (Brackets inside
    # strings that hide an unbalanced structure are left to json.loads, which refuses it alike.)
    raw_openers = body.count(b"{") + body.count(b"[")
    if (raw_openers <= max_depth and raw_openers + body.count(b",") <= max_items
            and body.count(b"}") + body.count(b"]") == raw_openers):
        return
    # Drop the escapes that could hide or fake a quote (C-speed replaces; pairs go left to
    # right, as a JSON parser reads a run of backslashes). Outside strings a backslash is
    # invalid JSON anyway, and json.loads rejects it at once.
    cleaned = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # A valid body has at most two strings per value (a key and its value), so a body with
    # more quotes than that is over the limit: refuse it before the per-string pass below.
    quotes = cleaned.count(b'"')
    if quotes > 4 * (max_items + 1):
        raise _too_many(quotes // 4, max_items)
    structure = _outside_strings(cleaned, quotes)
    del cleaned
    openers = structure.count(b"{") + structure.count(b"[")
    items = openers + structure.count(b",")
    balanced = structure.count(b"}") + structure.count(b"]") == openers
    # Depth first (a deep body shows its depth within its first brackets); the walk covers
    # at most the brackets a body within the item limit can have.
    brackets = structure.translate(_ALL_BYTES, _NOT_BRACKETS)[: 2 * max_items + 2]
    del structure
    depth = 0
    for byte in brackets:
        if byte in _OPENERS:
            depth += 1
            if depth > max_depth:
                raise JsonShapeRefused(
                    f"request body nests JSON deeper than {max_depth} levels: flatten it or ask the operator "
                    "to raise --max-json-depth", "json_too_deep")
        else:
            depth -= 1
    if items > max_items:
        raise _too_many(items, max_items)
    if not balanced:
        raise JsonShapeRefused("request body is not valid JSON (unbalanced brackets): check how it is built", "invalid_json")
