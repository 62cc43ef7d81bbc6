"""Header maps, framing checks and the bytes of a response head: written once, used by the
server (requests in), the replica client and the bench client (responses in)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

SINGLETON_HEADERS = frozenset(
    (
        "host",
        "content-length",
        "transfer-encoding",
        "content-type",
        "authorization",
        "x-api-key",
        "x-request-id",
        "x-session-id",
        "x-priority",
        "expect",
        "connection",
        "upgrade",
    )
)
"""Headers whose repetition has no agreed meaning: sent twice they are refused, never joined or
overwritten (a proxy that kept the first and one that kept the last would disagree)."""

MAX_HEADERS = 100  # fields per head: more is refused (uvicorn's and aiohttp's limits are of this order)
CRLF = b"\r\n"
TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked body, with no trailers


class FramingError(ValueError):
    """A head that this layer refuses on top of llhttp's own checks (repeated singleton, bad TE)."""


class Headers(dict[str, str]):
    """A message's header fields: names lower-cased, values as sent (Latin-1 text of the bytes).

    A repeated field is joined with ", " (RFC 9110 5.3), except SINGLETON_HEADERS, which are refused.
    `get` takes any spelling of a name."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name.lower() if isinstance(name, str) else name)

    def add(self, raw_name: bytes, raw_value: bytes) -> None:
        if len(self) >= MAX_HEADERS:
            raise FramingError(f"more than {MAX_HEADERS} header fields")
        name = raw_name.decode("latin-1").lower()
        # RFC 9110 5.5: trailing whitespace is not part of the value; llhttp drops only the leading
        # (`Expect: 100-continue ` was a 417, `X-Request-ID: id ` a 400)
        value = raw_value.decode("latin-1").rstrip(" \t")
        previous = dict.get(self, name)
        if previous is None:
            self[name] = value
        elif name in SINGLETON_HEADERS:
            raise FramingError(f"header {name!r} sent more than once")
        else:
            self[name] = f"{previous}, {value}"


def check_framing(headers: Headers) -> bool:
    """Whether the body is chunked; refuses a Transfer-Encoding other than exactly `chunked`
    (llhttp takes `identity, chunked` and, on responses, reads `chunked, identity` until close)."""
    encoding = dict.get(headers, "transfer-encoding")
    if encoding is None:
        return False
    if encoding.strip(" \t").lower() != "chunked":
        raise FramingError(f"Transfer-Encoding {encoding[:40]!r} is not supported (only 'chunked')")
    return True


def header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    """`Name: value` lines, each ending in CRLF: a response's, or a request's to a replica."""
    return "".join([f"{name}: {value}\r\n" for name, value in headers]).encode("latin-1")


class _Date:
    """The Date header's value, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, formatdate(second, usegmt=True).encode("ascii")
        return cls.value


_STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode("ascii")) for status in HTTPStatus}


def response_head(
    status: int, headers: Iterable[tuple[str, str]], *, chunked: bool = False, length: int | None = None, close: bool = False
) -> bytes:
    """Status line and headers of a response, ready to write."""
    parts = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status, header_lines(headers)]
    if chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    elif length is not None:
        parts.append(b"Content-Length: %d\r\n" % length)
    if close:
        parts.append(b"Connection: close\r\n")
    parts.append(b"Date: %s\r\n\r\n" % _Date.now())
    return b"".join(parts)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (empty data: nothing, never the terminator by accident)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
