"""Reading what a user hands us (a file, or one line of one) with its size, depth and count bounded
before anything big is allocated.

Why: Python's JSON and YAML readers recurse per nesting level (RecursionError at about 1,000),
build tens of bytes of objects per value (4.5 GB for a million-record result file), take
`NaN`, `Infinity` and `1e999` as numbers, and turn a 5,000-digit integer into a ValueError
that no caller expected. So every reader of a user's file goes through here:

- `read_bytes` refuses a file over its kind's byte limit from its size, before reading it;
- `json_shape` scans the raw bytes once, linearly and without recursing, for the nesting
  depth and the number of values (the gateway's request-body check is the same scan);
- `loads_json` runs that scan, then `json.loads` with hooks that refuse integers longer than
  `MAX_INT_DIGITS` and any number that is not finite;
- `yaml_shape` walks the YAML event stream (libyaml's parser keeps its own stack, it does not
  recurse) for depth and for the node count with every alias expanded, so a "billion laughs"
  file is refused before it is composed.

Each refusal is a `Refused` (a ValueError) whose message says what was over which limit; the
caller prefixes the file (or the line) it read. The limits are defined once, below, per kind
of file.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import yaml

MAX_DEPTH = 64
"""Nesting levels any user file may have: config.json, specs, results and batch lines use under 10."""

MAX_INT_DIGITS = 40
"""Digits an integer may have: int64 has 19, and some configs write 1e30 as a 31-digit integer."""


@dataclass(frozen=True)
class Limits:
    """The bounds of one kind of input: its bytes, its values (JSON values or YAML nodes), its depth."""

    kind: str
    """What the input is, as the refusal names it ('config file', 'batch line', ...)."""
    max_bytes: int
    max_items: int
    max_depth: int = MAX_DEPTH
    max_int_digits: int = MAX_INT_DIGITS


CONFIG_FILE = Limits("config file", max_bytes=16 << 20, max_items=1_000_000)
"""config.json, deployment specs, keys files, calibrations: a few kB in practice."""

RESULT_FILE = Limits("result file", max_bytes=512 << 20, max_items=4_000_000)
"""A result file for `runs import` (and the planner's JSON files): 4 million values is a detailed
vLLM run of ~230,000 requests of ten tokens, ~0.8 GB once read as records (benchmarks/user_file_memory.py)."""

BATCH_LINE = Limits("batch line", max_bytes=64 << 20, max_items=1_000_000)
"""One OpenAI Batch input line (inline images make a line megabytes long)."""

BATCH_RESULT_LINE = Limits("batch result line", max_bytes=1 << 30, max_items=64_000_000)
"""One line of a batch output file, read back to resume: it holds the server's answer (an
embeddings answer of 2,048 inputs of 3,072 dimensions is 6 million values), so only its
nesting is really in question."""

TRACE_LINE = Limits("trace line", max_bytes=1 << 20, max_items=10_000)
"""One line of a bench trace (a handful of fields and perhaps a prompt)."""

DATASET_ITEM = Limits("conversation", max_bytes=64 << 20, max_items=100_000)
"""One conversation of a ShareGPT file (read as a stream, so no whole-file byte bound)."""


class Refused(ValueError):
    """The input is over one of its limits; the message says which and by how much."""


class ShapeFinding(NamedTuple):
    """What `json_shape` found wrong: 'too_deep' (values = the depth reached), 'too_many' (values = how many) or 'unbalanced'."""

    kind: str
    values: int


_ALL_BYTES = bytes(range(256))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = frozenset(b"[{")


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
        if end < 0:  # an unterminated string runs to the end (json.loads will refuse the text)
            break
        position = end + 1
    return b"".join(pieces)


def json_shape(data: bytes, *, max_depth: int, max_items: int) -> ShapeFinding | None:
    """None when `data` nests at most max_depth deep and holds at most max_items values.

    The scan is linear and bounded in time and memory: C-speed replaces drop escapes, the
    quote count bounds the strings (refused before they are split off), slicing or one split
    removes strings, and the depth walk is a Python loop over at most 2 * max_items bracket
    bytes. At most two copies of the data live at once. Nothing here recurses. Values are
    counted as `{`, `[` and `,` outside strings.
    """
    # The common small input: counts over the raw bytes (strings included) bound the counts outside
    # strings, so when even they are within the limits nothing can be over them. (Brackets inside
    # strings that hide an unbalanced structure are left to json.loads, which refuses it alike.)
    raw_openers = data.count(b"{") + data.count(b"[")
    if (
        raw_openers <= max_depth
        and raw_openers + data.count(b",") <= max_items
        and data.count(b"}") + data.count(b"]") == raw_openers
    ):
        return None
    # Drop the escapes that could hide or fake a quote (C-speed replaces; pairs go left to
    # right, as a JSON parser reads a run of backslashes). Outside strings a backslash is
    # invalid JSON anyway, and json.loads rejects it at once.
    cleaned = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # A valid text has at most two strings per value (a key and its value), so one with more
    # quotes than that is over the limit: refuse it before the per-string pass below.
    quotes = cleaned.count(b'"')
    if quotes > 4 * (max_items + 1):
        return ShapeFinding("too_many", quotes // 4)
    structure = _outside_strings(cleaned, quotes)
    del cleaned
    openers = structure.count(b"{") + structure.count(b"[")
    items = openers + structure.count(b",")
    balanced = structure.count(b"}") + structure.count(b"]") == openers
    # Depth first (deep data shows its depth within its first brackets); the walk covers
    # at most the brackets that data within the item limit can have.
    brackets = structure.translate(_ALL_BYTES, _NOT_BRACKETS)[: 2 * max_items + 2]
    del structure
    depth = 0
    for byte in brackets:
        if byte in _OPENERS:
            depth += 1
            if depth > max_depth:
                return ShapeFinding("too_deep", depth)
        else:
            depth -= 1
    if items > max_items:
        return ShapeFinding("too_many", items)
    if not balanced:
        return ShapeFinding("unbalanced", 0)
    return None


def too_deep(limits: Limits) -> Refused:
    return Refused(f"nests deeper than {limits.max_depth} levels (the limit for a {limits.kind})")


def too_many(count: int, limits: Limits) -> Refused:
    return Refused(f"holds about {count:,} values, over the {limits.max_items:,} limit for a {limits.kind}")


def too_big(size: int, limits: Limits) -> Refused:
    return Refused(f"is {size:,} bytes, over the {limits.max_bytes:,}-byte limit for a {limits.kind}")


def too_long(limits: Limits) -> Refused:
    """A line or item whose end was never reached within the limit (its true size is not known)."""
    return Refused(f"is over the {limits.max_bytes:,}-byte limit for a {limits.kind}")


@functools.lru_cache(maxsize=None)
def _decoder(limits: Limits) -> json.JSONDecoder:
    """One decoder per kind of input, with the number hooks of its limits."""
    return json.JSONDecoder(**_number_hooks(limits))


def _number_hooks(limits: Limits) -> dict[str, Any]:
    """json.loads hooks: integers of at most max_int_digits digits, finite floats, no NaN/Infinity."""

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > limits.max_int_digits:
            raise Refused(
                f"has an integer of {len(text.lstrip('-')):,} digits, over the "
                f"{limits.max_int_digits}-digit limit for a {limits.kind}"
            )
        return int(text)

    def parse_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise Refused(
                f"has the number {text[:40]}, which is not finite (over the float range); "
                f"a {limits.kind} takes finite numbers only"
            )
        return value

    def parse_constant(text: str) -> float:
        raise Refused(f"has {text}, which is not a finite number; a {limits.kind} takes finite numbers only")

    return {"parse_int": parse_int, "parse_float": parse_float, "parse_constant": parse_constant}


def check_json(data: bytes, limits: Limits) -> None:
    """Raise Refused when `data` is over `limits` in bytes, depth or values (before any parser sees it)."""
    if len(data) > limits.max_bytes:
        raise too_big(len(data), limits)
    if len(data) <= limits.max_items and data.count(b"[") + data.count(b"{") <= limits.max_depth:
        return  # a short line: no more values than bytes, no deeper than its brackets
    finding = json_shape(data, max_depth=limits.max_depth, max_items=limits.max_items)
    if finding is None or finding.kind == "unbalanced":  # json.loads says where it breaks
        return
    raise too_deep(limits) if finding.kind == "too_deep" else too_many(finding.values, limits)


def loads_json(data: bytes | str, limits: Limits) -> Any:
    """`json.loads(data)` within `limits`: Refused when over one, json.JSONDecodeError when not JSON."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    check_json(raw, limits)
    text = data if isinstance(data, str) else data.decode(json.detect_encoding(data), "surrogatepass")
    return _decoder(limits).decode(text)  # as json.loads(data) would, without a new decoder per call


def read_bytes(path: Path, limits: Limits) -> bytes:
    """The file's bytes; Refused when its size is over the limit (checked before reading).

    OSError (missing, unreadable) is the caller's to word."""
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limits.max_bytes:
            raise too_big(size, limits)
        data = handle.read(limits.max_bytes + 1)  # a file that grew while we read is cut at the limit
    if len(data) > limits.max_bytes:
        raise too_big(len(data), limits)
    return data


def yaml_shape(text: str, limits: Limits) -> None:
    """Raise Refused when YAML `text` nests deeper than max_depth or has more than max_items nodes
    once every alias is expanded (what a reader that walks the loaded data would see).

    Walks the parser's events only (nothing is composed): libyaml's parser keeps its own
    stack, so depth cannot exhaust Python's. Each anchored node's expanded size is remembered,
    so an alias costs what its node costs, and nine levels of ten aliases count as a billion.
    """
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_class(text)
    anchored: dict[str, int] = {}
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, expanded nodes) of each open collection
    total = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(open_nodes) >= limits.max_depth:
                    raise too_deep(limits)
                open_nodes.append((event.anchor, total))
                total += 1
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, before = open_nodes.pop()
                if anchor is not None:
                    anchored[anchor] = total - before
            elif isinstance(event, yaml.ScalarEvent):
                total += 1
                if event.anchor is not None:
                    anchored[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                total += anchored.get(event.anchor, 1)  # an unknown alias is yaml.safe_load's error
            if total > limits.max_items:
                raise Refused(
                    f"has over {limits.max_items:,} values with its aliases expanded, the limit "
                    f"for a {limits.kind}; write the values out or use fewer aliases"
                )
    except yaml.YAMLError as err:  # libyaml's scanner stops at 1,000 levels, ahead of the events
        if "nesting depth" in str(err):
            raise too_deep(limits) from None
        raise
    finally:
        loader.dispose()


_LINE_END = re.compile(rb"\r\n?|\n")
_LINE_CHUNK = 1 << 20


def iter_lines(handle: IO[bytes], max_bytes: int) -> Iterator[bytes | None]:
    """Each line of a binary file without its end, for line-per-record files (JSONL).

    LF, CRLF and a lone CR all end a line (a file saved with old Mac line ends is read line by
    line, not as one malformed line; a JSON text holds no raw CR or LF inside its strings).
    A line over max_bytes is yielded as None and its bytes are skipped, never held: memory
    stays within max_bytes plus one read chunk, however long a line is.
    """
    rest = b""  # the start of a line whose end is not read yet
    skipping = False  # inside a line already over max_bytes
    while chunk := handle.read(_LINE_CHUNK):
        buffer = rest + chunk if rest else chunk
        held = b""
        if buffer.endswith(b"\r"):  # perhaps the first half of a CRLF split across reads
            buffer, held = buffer[:-1], b"\r"
        pieces = _LINE_END.split(buffer) if b"\r" in buffer else buffer.split(b"\n")  # C-speed either way
        rest = pieces.pop() + held
        for line in pieces:
            yield None if skipping or len(line) > max_bytes else line
            skipping = False
        if len(rest) > max_bytes + 1:  # no end in sight: drop what is read
            skipping = True
            rest = held
    if rest.endswith(b"\r"):
        rest = rest[:-1]
    if skipping:
        yield None
    elif rest:
        yield rest if len(rest) <= max_bytes else None


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, max_chars: int = 200) -> str:
    """`text` from a user's file made safe to print on a terminal: control characters (escape
    sequences, carriage returns, bidi overrides) shown as `\\xNN` / `\\uNNNN`, and cut to max_chars."""
    shown = _UNPRINTABLE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)
    return shown if len(shown) <= max_chars else shown[: max_chars - 1] + "…"
