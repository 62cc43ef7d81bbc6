"""The lean lane's HTTP: a strict subset of HTTP/1.1 requests, and responses written as bytes.

The gateway's listening socket first reads a connection's bytes itself (lean_lane.py). A request
inside the subset below is served without aiohttp's server; anything else — and the connection
with it, from that request on — is handed to aiohttp, which parses the same bytes from the start.
So this parser never has to judge a doubtful request: it only has to recognise, exactly, the
requests whose meaning no HTTP implementation disputes, and say "not mine" to the rest.

The subset: `POST` to a table path of kind ENGINE_WORK (routes.py), spelled exactly, no query;
`HTTP/1.1`; CRLF line ends; header names that are tokens and values of printable ASCII; every
header name once; one decimal `Content-Length` within the body limit; no `Transfer-Encoding`,
`Expect` or `Upgrade`; `Connection` absent, `keep-alive` or `close`; a head of at most
`MAX_HEAD_BYTES`, however its bytes arrive (one write or many: the limit is on the head, never on
a read). That is what every OpenAI SDK and load generator sends for a chat completion.
`Connection: close` is served here too, and what a client sends after that request is not read
(RFC 9112 9.6: no further request on that connection is processed).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from aiohttp import web

from vlmserve.gateway.routes import ROUTE_KEY, ROUTES, Route, RouteKind

MAX_HEAD_BYTES = 8192  # a longer head goes to aiohttp, whose own limits then apply
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
"""What a connection that did not complete its head in time gets, on either lane, before it is closed."""
CLOSE_LINGER_S = 1.0
"""After a 408 or a 503 refusal the connection is half-closed and what the client still sends is read and
discarded this long (or until it closes its side) before the socket closes: closing with unread bytes makes
the kernel answer with a reset, and a reset can reach the client before it has read the answer."""
_REQUEST_LINE = re.compile(rb"POST (/[-!$&'()*+,./0-9:;=@A-Z_a-z~]*) HTTP/1\.1")
# The header block: fields of a token, a colon, printable ASCII or tabs, and CRLF, and nothing
# else. One `fullmatch` judges the whole block without building anything; the block is then split
# on CRLF (a valid value holds no CR or LF, a name no colon, so each piece is one field). The pass
# is linear in the block whatever a client sends: every repeat is possessive, so no character is
# tried twice. A backtracking form of it cost the gateway 0.37 s of CPU on a head of one 8 KB run
# of token characters (benchmarks/lean_head_parse.py).
_FIELDS = re.compile(r"(?:[-!#$%&'*+.^_`|~0-9A-Za-z]++:[\t -~]*+\r\n)*+")
_ROUTE_OF_LINE: dict[bytes, Route | None] = {}  # request line -> its route (None: not lean), for the lines seen
_REFUSED_HEADERS = frozenset(("transfer-encoding", "expect", "upgrade"))


class LeanHeaders(dict[str, str]):
    """A request's headers, names lower-cased; `get` takes any spelling, as aiohttp's do."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)


class LeanRequest:
    """What the gateway's handlers read of a request, for one served on the lean lane."""

    __slots__ = ("path", "headers", "content_length", "body", "transport", "connection", "route", "method")

    def __init__(self, route: Route, headers: LeanHeaders, body: bytes, transport: asyncio.Transport,
                 connection: Any) -> None:
        self.method = "POST"
        self.path = route.path
        self.headers = headers
        self.content_length: int | None = len(body)
        self.body = body
        self.transport: asyncio.Transport | None = transport
        self.connection = connection  # the lean_lane.LeanConnection it came on
        self.route = route

    def __getitem__(self, key: Any) -> Any:
        """`request[ROUTE_KEY]`, as on an aiohttp request (the route is all the handlers keep there)."""
        if key is ROUTE_KEY:
            return self.route
        raise KeyError(key)

    async def read(self) -> bytes:
        return self.body


ClientRequest = web.Request | LeanRequest
"""What the engine-work handler is given: an aiohttp request, or one from the lean lane."""


class LeanHead:
    """A request head inside the subset: its route, headers and body length."""

    __slots__ = ("route", "headers", "content_length", "close")

    def __init__(self, route: Route, headers: LeanHeaders, content_length: int, close: bool = False) -> None:
        self.route = route
        self.headers = headers
        self.content_length = content_length
        self.close = close  # Connection: close: the connection ends after this request's answer


def _lean_route(request_line: bytes) -> Route | None:
    """The engine-work route a request line POSTs to, if the line is inside the subset."""
    try:
        return _ROUTE_OF_LINE[request_line]  # one lookup for a line seen before (None included)
    except KeyError:
        pass
    route = _check_request_line(request_line)
    if len(_ROUTE_OF_LINE) < 256 and len(request_line) <= 128:  # a client cycling paths cannot grow it
        _ROUTE_OF_LINE[request_line] = route
    return route


def _check_request_line(request_line: bytes) -> Route | None:
    match = _REQUEST_LINE.fullmatch(request_line)
    route = ROUTES.get(match.group(1).decode("ascii")) if match is not None else None
    if route is None or route.kind is not RouteKind.ENGINE_WORK or route.method != "POST":
        return None
    return route


def first_line_fits(line: bytes) -> bool:
    """Whether a request line can start a lean request (checked as soon as it arrives, so a GET
    /health or anything unusual goes to aiohttp at once)."""
    return _lean_route(line) is not None


def _fill_fields_python(head: bytes, start: int, headers: LeanHeaders) -> bool:
    """The fields of `head[start:]` into `headers`, names lower-cased and values stripped of blanks;
    False for a block that is not all fields (`_FIELDS`) or that names a header twice.
    `_native_head.fill_fields` does the same in C where it was built."""
    block = head[start:].decode("latin-1") + "\r\n"
    if _FIELDS.fullmatch(block) is None:
        return False  # something in the block that is not a field
    fields = block.split("\r\n")
    fields.pop()  # the empty piece after the last CRLF
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.lower()] = value.strip(" \t")
    return len(headers) == len(fields)  # a header sent twice: aiohttp decides what that means


try:
    from vlmserve.gateway import _native_head  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install): the same rules in Python
    _native_head = None
_fill_fields: Callable[[bytes, int, LeanHeaders], bool] = (
    _fill_fields_python if _native_head is None else _native_head.fill_fields)


def parse_head(head: bytes, max_body_bytes: int) -> LeanHead | None:
    """The head (without its final blank line) if it is inside the subset, else None."""
    if len(head) > MAX_HEAD_BYTES:
        return None  # aiohttp's limits judge it, whether it came in one read or many
    line_end = head.find(b"\r\n")
    if line_end < 0:
        return None  # no Content-Length, so not inside the subset
    route = _lean_route(head[:line_end])
    if route is None:
        return None
    headers = LeanHeaders()
    if not _fill_fields(head, line_end + 2, headers):
        return None
    length = dict.get(headers, "content-length")  # names are lower-cased: no need for LeanHeaders.get
    if length is None or not length.isdigit() or len(length) > 12 or int(length) > max_body_bytes:
        return None
    connection = dict.get(headers, "connection")
    close = False
    if connection is not None:
        connection = connection.lower()
        if connection not in ("keep-alive", "close"):
            return None
        close = connection == "close"
    if not _REFUSED_HEADERS.isdisjoint(headers):
        return None
    return LeanHead(route, headers, int(length), close)


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


_STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode("ascii"))
                 for status in HTTPStatus}


def header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    """`Name: value` lines, each ending in CRLF, as bytes: a response's (response_head) or a
    request's to a replica (upstream.UpstreamPool.request)."""
    return "".join([f"{name}: {value}\r\n" for name, value in headers]).encode("latin-1")


def response_head(status: int, headers: Iterable[tuple[str, str]], *, chunked: bool = False,
                  length: int | None = None, close: bool = False) -> bytes:
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


def serialize_response(response: web.Response) -> tuple[bytes, bool]:
    """A whole aiohttp Response (the handlers' error and unary answers) as bytes, and whether
    the connection closes after it."""
    body = response.body if response.body is not None else b""
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError(f"the lean lane writes bytes bodies only, not {type(body).__name__}")
    close = response.keep_alive is False
    headers = [(name, value) for name, value in response.headers.items()
               if name.lower() not in ("content-length", "transfer-encoding", "connection", "date")]
    head = response_head(response.status, headers, length=len(body), close=close)
    return head + bytes(body), close
