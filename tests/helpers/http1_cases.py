"""HTTP/1.1 responses a server (to the bench) or a replica (to the gateway) may send, and what the
project's one response reader (vlmserve.http1.reader) must do with each.

One list, so that every client of the project is held to the same framing rules: the bench's
tests (tests/integration/bench/test_http1_hostile.py) replay it today, the gateway's replica-side
tests can replay the same cases. Each refused case says, by a fragment of the reader's one-line
error, what was wrong; each case's bytes are a whole answer written in one go. The chunk-size
cases carry a chunk of exactly the length a lax `int(size, 16)` reads, so a parser that takes
`0x1a` would deliver a well-formed answer: only refusing it passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from vlmserve.http1.reader import ProtocolError, ResponseHead, ResponseReader

EVENT = b'data: {"choices":[{"index":0,"text":"hi"}]}\n\n'
DONE = b"data: [DONE]\n\n"
BODY = EVENT + DONE
"""The payload every accepted case carries: one token-bearing SSE event and the end marker."""

STATUS = b"HTTP/1.1 200 OK\r\n"
SSE_TYPE = b"Content-Type: text/event-stream\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
TERMINATOR = b"0\r\n\r\n"

PADDED_EVENT = b'data: {"t":"' + b"x" * 10 + b'"}\n\n'
"""26 bytes, 0x1a: the chunk behind the non-hex spellings of that size."""
assert len(PADDED_EVENT) == 0x1A


def chunk(data: bytes, size: bytes | None = None) -> bytes:
    """One chunk; `size` replaces the chunk-size line's text (a hostile spelling)."""
    return (size if size is not None else b"%x" % len(data)) + b"\r\n" + data + b"\r\n"


def chunked_response(*chunks: bytes, head: bytes = STATUS + SSE_TYPE + CHUNKED) -> bytes:
    return head + b"\r\n" + b"".join(chunks) + TERMINATOR


def length_response(body: bytes = BODY, head: bytes = STATUS + SSE_TYPE) -> bytes:
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


GOOD = chunked_response(chunk(EVENT), chunk(DONE))
"""A well-formed streamed answer: what a server sends when nothing is wrong."""


@dataclass(frozen=True)
class ResponseCase:
    name: str
    """What is wrong (or unusual) with the answer; the hostile table's words for it."""
    response: bytes
    error: str | None
    """A fragment of the reader's one-line error when the answer is refused; None when it is accepted."""
    body: bytes = BODY
    """The de-chunked payload of an accepted answer."""
    headers: dict[str, str] = field(default_factory=dict)
    """Header values an accepted answer must show (names lower-cased)."""

    @property
    def refused(self) -> bool:
        return self.error is not None


CASES: tuple[ResponseCase, ...] = (
    # chunk sizes: plain hex only (RFC 9112 7.1: chunk-size = 1*HEXDIG), within 64 bits
    ResponseCase(
        "chunk size `0x1a`", chunked_response(chunk(PADDED_EVENT, b"0x1a"), chunk(DONE)), "Invalid character in chunk size"
    ),
    ResponseCase(
        "chunk size `+1a`", chunked_response(chunk(PADDED_EVENT, b"+1a"), chunk(DONE)), "Invalid character in chunk size"
    ),
    ResponseCase(
        "chunk size `1_a`", chunked_response(chunk(PADDED_EVENT, b"1_a"), chunk(DONE)), "Invalid character in chunk size"
    ),
    ResponseCase(
        "chunk size of 20 hex digits (overflows 64 bits)",
        chunked_response(chunk(EVENT, b"1" + b"0" * 19), chunk(DONE)),
        "Chunk size overflow",
    ),
    ResponseCase(
        "chunk size with leading zeros (18 digits, no overflow)",
        chunked_response(chunk(EVENT, b"0" * 16 + b"%02x" % len(EVENT)), chunk(DONE)),
        None,
    ),
    ResponseCase(
        "chunk extension (`;name=value` and `;name`)",
        chunked_response(chunk(EVENT, b"%x;foo=bar" % len(EVENT)), chunk(DONE, b"%x;baz" % len(DONE))),
        None,
    ),
    ResponseCase(
        "chunk data not followed by CRLF",
        chunked_response(b"%x\r\n%sXX\r\n" % (len(EVENT), EVENT), chunk(DONE)),
        "after chunk data",
    ),
    # header lines
    ResponseCase(
        "header line without a colon", length_response(head=STATUS + SSE_TYPE + b"X-Broken header\r\n"), "Invalid header token"
    ),
    ResponseCase(
        "obs-fold (a header continued on the next line)",
        length_response(head=STATUS + SSE_TYPE + b"X-Folded: a\r\n b\r\n"),
        "Unexpected whitespace after header value",
    ),
    ResponseCase(
        "bare LF ending a header line",
        length_response(head=STATUS + SSE_TYPE + b"X-Bare: lf\n"),
        "Missing expected CR after header value",
    ),
    ResponseCase(
        "bare LF ending the status line",
        length_response(head=b"HTTP/1.1 200 OK\n" + SSE_TYPE),
        "Missing expected CR after response line",
    ),
    ResponseCase(
        "NUL in a header value", length_response(head=STATUS + SSE_TYPE + b"X-Nul: a\x00b\r\n"), "Invalid header value char"
    ),
    ResponseCase(
        "a repeated singleton header (Content-Type twice)",
        length_response(head=STATUS + SSE_TYPE + SSE_TYPE),
        "header 'content-type' sent more than once",
    ),
    ResponseCase(
        "a repeated list header is joined, not overwritten",
        length_response(head=STATUS + SSE_TYPE + b"X-Note: a\r\nX-Note: b\r\n"),
        None,
        headers={"x-note": "a, b"},
    ),
    # framing: exactly one way to find the body's end
    ResponseCase(
        "duplicate Content-Length",
        STATUS + SSE_TYPE + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(BODY), len(BODY)) + BODY,
        "Duplicate Content-Length",
    ),
    ResponseCase(
        "Content-Length with Transfer-Encoding (CL+TE)",
        chunked_response(chunk(EVENT), chunk(DONE), head=STATUS + SSE_TYPE + b"Content-Length: %d\r\n" % len(BODY) + CHUNKED),
        "Transfer-Encoding can't be present with Content-Length",
    ),
    ResponseCase(
        "`Transfer-Encoding: chunked, identity`",
        chunked_response(chunk(EVENT), chunk(DONE), head=STATUS + SSE_TYPE + b"Transfer-Encoding: chunked, identity\r\n"),
        "Transfer-Encoding 'chunked, identity' is not supported",
    ),
    ResponseCase(
        "Content-Length `+%d`" % len(BODY),
        STATUS + SSE_TYPE + b"Content-Length: +%d\r\n\r\n" % len(BODY) + BODY,
        "Invalid character in Content-Length",
    ),
    ResponseCase(
        "bytes after the response (a second, smuggled response)",
        GOOD + length_response(b'{"smuggled":true}', head=STATUS),
        "bytes after the end of the response",
    ),
    ResponseCase(
        "100 Continue before the answer (nothing sent Expect)",
        b"HTTP/1.1 100 Continue\r\n\r\n" + GOOD,
        "unexpected informational response 100",
    ),
    ResponseCase("not HTTP at all", b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "Expected HTTP/"),
    ResponseCase(
        "HTTP/2.0 in the status line", b"HTTP/2.0 200 OK\r\n" + SSE_TYPE + b"Content-Length: 0\r\n\r\n", "HTTP/2.0 response"
    ),
)


def case_id(case: ResponseCase) -> str:
    """A pytest id from a case's name."""
    return "".join(c if c.isalnum() else "-" for c in case.name.lower()).strip("-")


def head_splits(response: bytes = GOOD) -> Iterator[tuple[bytes, bytes]]:
    """`response` cut in two at every byte boundary inside its head (and just after it)."""
    head_end = response.index(b"\r\n\r\n") + 4
    for cut in range(1, head_end + 1):
        yield response[:cut], response[cut:]


class _Payload:
    def __init__(self) -> None:
        self.payload = b""

    def on_response_head(self, head: ResponseHead) -> None:
        pass

    def on_response_body(self, data: bytes) -> None:
        self.payload += data

    def on_response_end(self) -> None:
        pass


def payload_before_refusal(case: ResponseCase) -> bytes:
    """The payload the reader hands on before it refuses the case (the relay passes it on)."""
    sink = _Payload()
    reader = ResponseReader(sink)
    reader.expect()
    try:
        reader.feed(case.response)
    except ProtocolError:
        pass
    return sink.payload
