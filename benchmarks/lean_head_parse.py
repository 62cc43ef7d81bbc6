"""CPU cost of judging one request head on the gateway's lean lane, for ordinary and hostile heads.

The lean lane (gateway/lean_http.py) judges a request's header block with one regular-expression
pass. That pass must stay linear in the block whatever a client sends: an unauthenticated client
controls up to MAX_HEAD_BYTES of it. Configurations, timed side by side in rounds (order rotated
each round), CPU time of this process:
- `parse_head`: the gateway's parser, as it is (its field split in C, `_native_head.c`, where built);
- `python split`: the same parser with the field split in Python (`_fill_fields_python`: what
  runs where the C part was not built, and what ran before 2026-11-28);
- `earlier pattern`: the field split the parser had before 2026-11-27 (`findall` with no line
  anchor and backtracking repeats, then the lengths compared), in front of `parse_head`, for
  reference: on a block that is one long run of token characters that pattern tried a match from
  every character, each running to the end.

Heads: an ordinary SDK head, and blocks of MAX_HEAD_BYTES built to make a backtracking pattern
work hard (a token run with no colon, a value of blanks ending in a control byte, colons only,
bare-LF lines). Each is refused (None) except the ordinary one; the script checks that too.

    .venv/bin/python benchmarks/lean_head_parse.py [--rounds 5] [--min-time 0.2]
    .venv/bin/python benchmarks/lean_head_parse.py --smoke
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable

from _smoke import parse_args

from vlmserve.gateway import lean_http
from vlmserve.gateway.lean_http import MAX_HEAD_BYTES, parse_head

EARLIER_FIELD_PARTS = re.compile(r"([-!#$%&'*+.^_`|~0-9A-Za-z]+):([\t -~]*)\r\n")
REQUEST_LINE = b"POST /v1/chat/completions HTTP/1.1\r\n"
ROOM = MAX_HEAD_BYTES - len(REQUEST_LINE) - 2

HEADS: dict[str, bytes] = {
    "ordinary SDK head": REQUEST_LINE + b"Host: 127.0.0.1:9000\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
                         b"User-Agent: OpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\nContent-Length: 512",
    "token run, no colon": REQUEST_LINE + b"a" * ROOM,
    "blank value, control byte": REQUEST_LINE + b"a:" + b" " * (ROOM - 3) + b"\x01",
    "colons only": REQUEST_LINE + b":" * ROOM,
    "bare-LF lines": REQUEST_LINE + b"a\n" * (ROOM // 2),
}


def earlier(head: bytes) -> object:
    """The earlier field split (its verdict on the block), then parse_head for the rest."""
    line_end = head.find(b"\r\n")
    block = "" if line_end < 0 else head[line_end + 2:].decode("latin-1") + "\r\n"
    fields = EARLIER_FIELD_PARTS.findall(block)
    if sum(len(name) + len(value) for name, value in fields) + 3 * len(fields) != len(block):
        return None
    return parse_head(head, 1 << 20)


def current(head: bytes) -> object:
    return parse_head(head, 1 << 20)


def python_split(head: bytes) -> object:
    built = lean_http._fill_fields
    lean_http._fill_fields = lean_http._fill_fields_python
    try:
        return parse_head(head, 1 << 20)
    finally:
        lean_http._fill_fields = built


def cpu_per_call(fn: Callable[[bytes], object], head: bytes, min_time_s: float) -> float:
    """CPU seconds per call, over calls adding up to at least `min_time_s`."""
    calls = 0
    started = time.process_time()
    while True:
        fn(head)
        calls += 1
        spent = time.process_time() - started
        if spent >= min_time_s:
            return spent / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per head (default 5)")
    parser.add_argument("--min-time", type=float, default=0.2, help="CPU seconds per timing at least (default 0.2)")
    args = parse_args(parser, rounds=1, min_time=0.001)
    configurations: dict[str, Callable[[bytes], object]] = {"parse_head": current, "python split": python_split,
                                                             "earlier pattern": earlier}
    if lean_http._fill_fields is lean_http._fill_fields_python:
        print("note: the C field split is not built in this install; parse_head runs the Python split")
    for name, head in HEADS.items():
        for label, parse in configurations.items():
            if (parse(head) is not None) != (name == "ordinary SDK head"):
                raise SystemExit(f"{label}: the {name!r} head was judged wrongly")
    others = [label for label in configurations if label != "parse_head"]
    print(f"{'head':28s} {'parse_head':>12s}" + "".join(f" {label:>16s} {'ratio':>7s}" for label in others))
    for name, head in HEADS.items():
        times: dict[str, list[float]] = {label: [] for label in configurations}
        order = list(configurations)
        for round_index in range(args.rounds):
            shift = round_index % len(order)
            for label in order[shift:] + order[:shift]:
                times[label].append(cpu_per_call(configurations[label], head, args.min_time))
        line = f"{name:28s} {statistics.median(times['parse_head']) * 1e6:9.2f} us"
        for label in others:
            ratios = [other / now for now, other in zip(times["parse_head"], times[label])]
            line += f" {statistics.median(times[label]) * 1e6:13.2f} us {statistics.median(ratios):6.2f}x"
        print(line)
    print("ratio: the configuration's CPU per call over parse_head's, median over rounds of the paired ratios")

if __name__ == "__main__":
    main()
