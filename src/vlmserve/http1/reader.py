"""Reading HTTP/1.1 responses with llhttp, for the project's one client (client.py).

One `ResponseReader` per connection; `expect()` before each request's response. Bytes go in
with `feed` as they arrive; the sink hears the head, each piece of body payload (de-chunked) and
the end, synchronously, from inside `feed` — no task wake-up per chunk. The close of the
connection goes in with `feed_eof`, which ends a body delimited by the close.

Refused (ProtocolError, the connection is then not to be reused): anything llhttp refuses
(a status line that is not HTTP, CL with TE, a duplicate Content-Length, a chunk size that is not
plain hex — `0x1a`, `+1a`, `1_a` — or overflows, a missing CRLF), a repeated singleton header or
a Transfer-Encoding other than `chunked` (headers.py), an HTTP version other than 1.0/1.1, an
informational (1xx) response (nothing here sends `Expect`), a head over `max_head_bytes`, and
bytes after the end of the response.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httptools

from vlmserve.http1.headers import FramingError, Headers, check_framing

MAX_RESPONSE_HEAD_BYTES = 64 * 1024


class ProtocolError(Exception):
    """The peer's answer is not HTTP/1.1 this layer accepts."""


@dataclass(slots=True)
class ResponseHead:
    status: int
    headers: Headers
    chunked: bool
    length: int | None  # Content-Length when not chunked; None with chunked or a body ended by the close
    keep_alive: bool
    http10: bool


class ResponseSink(Protocol):
    def on_response_head(self, head: ResponseHead) -> None: ...

    def on_response_body(self, data: bytes) -> None: ...

    def on_response_end(self) -> None: ...


class ResponseReader:
    """llhttp's response parser, fed one response at a time, reporting to a sink."""

    __slots__ = (
        "sink",
        "max_head_bytes",
        "_parser",
        "_headers",
        "head",
        "head_size",
        "head_fed",
        "complete",
        "error",
        "on_body",
        "__weakref__",
    )

    def __init__(self, sink: ResponseSink, max_head_bytes: int = MAX_RESPONSE_HEAD_BYTES) -> None:
        self.sink = sink
        self.max_head_bytes = max_head_bytes
        self._parser: httptools.HttpResponseParser | None = None
        self._headers = Headers()
        self.head: ResponseHead | None = None
        self.head_size = 0  # status line and fields as parsed: the same however TCP splits them
        self.head_fed = 0  # bytes of whole reads while the head is incomplete (feed)
        self.complete = True  # no response expected: bytes now are bytes after the response
        self.error: str | None = None
        self.on_body: Callable[[bytes], object] = sink.on_response_body

    def expect(self, on_body: Callable[[bytes], object] | None = None) -> None:
        """A request went out: read its response from the next byte on.

        llhttp calls `on_body` (default: the sink's `on_response_body`) with each piece of payload;
        it is bound when the parser is made, so a caller on a hot path may pass a C callable (a
        list's `append`) and take the pieces after `feed` returns, with no Python call per piece."""
        self.on_body = on_body if on_body is not None else self.sink.on_response_body
        self._parser = httptools.HttpResponseParser(self)
        self._headers = Headers()
        self.head = None
        self.head_size = 0
        self.head_fed = -1  # the head begins in the next read
        self.complete = False
        self.error = None

    def feed(self, data: bytes) -> None:
        """Parse `data`; the sink hears of what it completes. Raises ProtocolError."""
        parser = self._parser
        if self.complete or parser is None:
            raise ProtocolError("bytes after the end of the response")
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._parser = None
            raise ProtocolError(self.error or f"not valid HTTP/1.1 ({err})") from None
        if self.head is None:
            # A head still incomplete: counted over whole reads after the one it began in, so a head
            # that never ends is refused once past the limit; one that completes is judged by its
            # parsed size (on_headers_complete), whatever the reads were.
            self.head_fed = 0 if self.head_fed < 0 else self.head_fed + len(data)
            if self.head_fed > self.max_head_bytes:
                self._parser = None
                raise ProtocolError(self._head_too_large())

    def feed_eof(self) -> bool:
        """The connection closed: True when that ends the response (a body delimited by the close)."""
        head = self.head
        if self.complete:
            return True
        if head is not None and not head.chunked and head.length is None:
            self.complete = True
            self.sink.on_response_end()
            return True
        return False

    # ---- llhttp's callbacks ----------------------------------------------------------------------

    def _head_too_large(self) -> str:
        return f"response head over {self.max_head_bytes} bytes"

    def _check_head_size(self, added: int) -> None:
        self.head_size += added
        if self.head_size > self.max_head_bytes:
            self.error = self._head_too_large()
            raise ProtocolError(self.error)

    def on_message_begin(self) -> None:
        if self.complete:
            self.error = "bytes after the end of the response"
            raise ProtocolError(self.error)

    def on_status(self, status: bytes) -> None:
        self._check_head_size(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head is not None:
            return  # a trailer of a chunked body: not used
        self._check_head_size(len(name) + len(value) + 4)
        try:
            self._headers.add(name, value)
        except FramingError as err:
            self.error = str(err)
            raise

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        version = parser.get_http_version()
        headers = self._headers
        self._check_head_size(len("HTTP/1.1 200 \r\n\r\n"))
        try:
            if version not in ("1.1", "1.0"):
                raise FramingError(f"HTTP/{version} response (only HTTP/1.1 and 1.0 are read)")
            if status < 200:
                raise FramingError(f"unexpected informational response {status:03d}")
            chunked = check_framing(headers)
        except FramingError as err:
            self.error = str(err)
            raise
        length = dict.get(headers, "content-length")
        self.head = ResponseHead(
            status,
            headers,
            chunked,
            None if chunked or length is None else int(length),
            parser.should_keep_alive(),
            version == "1.0",
        )
        self.sink.on_response_head(self.head)

    def on_message_complete(self) -> None:
        self.complete = True
        self.sink.on_response_end()
