"""Cheap checks of a JSON body's shape, run on the raw bytes before `json.loads`.

The rules this module keeps:
- Nesting deeper than `max_depth` is refused before any parser sees it, so no parser can
  recurse out of stack (a 100,000-deep array used to raise RecursionError in `json.loads`).
- At most `max_items` JSON containers and elements (counted as `{`, `[` and `,` outside
  strings) are parsed. Parsed JSON costs tens to hundreds of bytes of Python objects per
  value, so this bounds the gateway's memory for one request by its body size plus a fixed
  amount (`max_items` small objects), however the body is shaped.
- The scan (`bounded_read.json_shape`, shared with every reader of a user's file) is linear
  and bounded in time and memory, and nothing in it recurses.
"""

from __future__ import annotations

from vlmserve.bounded_read import json_shape
from vlmserve.gateway.openai_errors import Refusal


class JsonShapeRefused(Refusal):
    """The body is too deep, too big in values, or unbalanced (400); the message says what to change."""


def check_json_shape(body: bytes, *, max_depth: int, max_items: int) -> None:
    """Raise JsonShapeRefused if `body` nests deeper than max_depth or holds over max_items values.

    The scan is the one every reader of a user's file uses (`bounded_read.json_shape`); the
    messages and codes here are the gateway's."""
    finding = json_shape(body, max_depth=max_depth, max_items=max_items)
    if finding is None:
        return
    if finding.kind == "too_deep":
        raise JsonShapeRefused(
            400,
            f"request body nests JSON deeper than {max_depth} levels: flatten it or ask the operator to raise --max-json-depth",
            "json_too_deep",
        )
    if finding.kind == "too_many":
        raise JsonShapeRefused(
            400,
            f"request body has about {finding.values} JSON values, over the {max_items} limit: split the request "
            "(fewer messages or inputs) or ask the operator to raise --max-json-items",
            "too_many_json_items",
        )
    raise JsonShapeRefused(400, "request body is not valid JSON (unbalanced brackets): check how it is built", "invalid_json")
