"""The gateway's HTTP/1.1 server (vlmserve/http1/server.py) on the wire: raw sockets against a real
gateway and a sim engine, so that the exact bytes, and how TCP splits them, are the test's.

What is checked for every request the server refuses: the exact status, the OpenAI-format error
body's code and message, one log line, the connection closed after the answer, and that the
engine got no request (a control request sent after the refused one must be the only one the
engine finished). Framings the server accepts (chunk sizes with leading zeros, chunk extensions,
trailers) are safe whatever another hop would make of them: the gateway never forwards the
client's framing, it re-sends the body it read with its own Content-Length (http1/client.py), so the
engine's prompt-token count for them is checked equal to that of the same body sent plainly.

Everything here uses answers that need no stream (/health, /v1/models, HEAD, unary chat, requests
refused before engine work), except the one case named so, which waits for the streamed relay.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, running_gateway, sim_engines
from tests.helpers.sim import SimHandle
from vlmserve.http1.messages import Request, Response

HEAD_LIMIT = 16384  # ServerLimits.max_head_bytes' default, which these tests run under
BODY_LIMIT = 4096  # --max-body-bytes of the gateways below that test the body limit
REPLY_TIMEOUT_S = 15.0
CLOSE_WAIT_S = 5.0  # a refused connection closes at once; an idle kept-alive one only after 75 s


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with sim_engines(1, tmp_path_factory.mktemp("http1"), ttft_ms=5, itl_ms=1) as handles:
        yield handles[0]


# ---- requests, replies and the engine's count -----------------------------------------------------


def unary(content: str = "hello", max_tokens: int = 2, **extra: Any) -> bytes:
    """A chat request body the sim answers in one JSON body (no stream)."""
    return json.dumps(chat_body(content, max_tokens=max_tokens, stream=False, **extra)).encode()


def post(
    body: bytes, *extra: bytes, path: bytes = b"/v1/chat/completions", version: bytes = b"HTTP/1.1", length: bool = True
) -> bytes:
    """A POST head (with `extra` header lines, each without its CRLF) and its body as given."""
    lines = [
        b"POST " + path + b" " + version,
        b"Host: gateway",
        b"Content-Type: application/json",
        *([b"Content-Length: %d" % len(body)] if length else []),
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chunked_post(body: bytes, size_line: bytes, *extra: bytes, trailer: bytes = b"") -> bytes:
    """`body` as one chunk whose size line is `size_line`, then the last chunk (and a trailer)."""
    return post(
        size_line + b"\r\n" + body + b"\r\n0\r\n" + trailer + b"\r\n", b"Transfer-Encoding: chunked", *extra, length=False
    )


def get(path: bytes = b"/health", *extra: bytes, version: bytes = b"HTTP/1.1", method: bytes = b"GET") -> bytes:
    return b"\r\n".join([method + b" " + path + b" " + version, b"Host: gateway", *extra]) + b"\r\n\r\n"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        return self.json["error"]

    def normalised(self) -> tuple[int, list[tuple[str, str]], bytes]:
        """What must not depend on how the request was split: all but the Date and the gateway's id."""
        kept = sorted((n, v) for n, v in self.headers.items() if n not in ("date", "x-request-id"))
        return self.status, kept, self.body


async def read_reply(reader: asyncio.StreamReader, *, head_only: bool = False) -> Reply:
    """One response, read strictly: a 1xx has no body; else Content-Length bytes (none for HEAD)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REPLY_TIMEOUT_S)
    status_line, *fields = head[:-4].decode("latin-1").split("\r\n")
    match = re.fullmatch(r"HTTP/1\.1 (\d{3}) [A-Za-z -]+", status_line)
    assert match, f"not a status line: {status_line!r}"
    headers: dict[str, str] = {}
    for field in fields:
        name, sep, value = field.partition(": ")
        assert sep and name.lower() not in headers, f"bad or repeated response header {field!r}"
        headers[name.lower()] = value
    status = int(match.group(1))
    if status < 200 or head_only:
        return Reply(status, headers, b"")
    assert "transfer-encoding" not in headers, "an answer that needs no stream came chunked"
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), REPLY_TIMEOUT_S)
    return Reply(status, headers, body)


async def read_rest(reader: asyncio.StreamReader, timeout_s: float = CLOSE_WAIT_S) -> bytes | None:
    """What the gateway still sends until it closes the connection; None if it is still open after timeout_s."""
    try:
        return await asyncio.wait_for(reader.read(), timeout_s)
    except asyncio.TimeoutError:
        return None
    except ConnectionError:
        return b""


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def send(writer: asyncio.StreamWriter, *pieces: bytes, pause_s: float = 0.02) -> None:
    """One write per piece, flushed and apart in time, so that the gateway reads them apart."""
    for n, piece in enumerate(pieces):
        if n:
            await asyncio.sleep(pause_s)
        writer.write(piece)
        await writer.drain()


async def talk(
    port: int,
    *pieces: bytes,
    replies: int = 1,
    head_only: bool = False,
    shut_write: bool = False,
    rest_timeout_s: float = CLOSE_WAIT_S,
) -> tuple[list[Reply], bytes | None]:
    """Send `pieces`, read `replies` answers, then whatever comes until the close (None: still open)."""
    reader, writer = await connect(port)
    try:
        await send(writer, *pieces)
        if shut_write:
            writer.write_eof()
        answers = [await read_reply(reader, head_only=head_only) for _ in range(replies)]
        return answers, await read_rest(reader, rest_timeout_s)
    finally:
        writer.close()


async def engine_finished(engine: SimHandle, reason: str = "") -> int:
    """Requests the sim engine has finished (for any reason, or for `reason`): what reached it."""
    text = await asyncio.to_thread(engine.metrics_text)
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total") and f'finished_reason="{reason}' in line
        )
    )


async def control(port: int) -> Reply:
    """A good request on a new connection: the gateway still serves, and the engine gets exactly this one."""
    [reply], rest = await talk(port, post(unary("control"), b"Connection: close"))
    assert reply.status == 200 and reply.json["object"] == "chat.completion", reply.body[:200]
    assert rest == b""
    return reply


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "vlmserve.http1" and r.levelno >= logging.INFO]


async def assert_refused(
    gw: Any,
    engine: SimHandle,
    caplog: pytest.LogCaptureFixture,
    *pieces: bytes,
    status: int,
    code: str,
    message: str,
    replies_before: int = 0,
    error_type: str = "invalid_request_error",
    logged: bool = True,
) -> list[Reply]:
    """The request is answered `status` with `code` and `message` (a fragment), after `replies_before`
    good answers; then the connection closes; one log line (none for a timeout, which a slowloris
    would otherwise turn into a flood of lines); the engine never saw it."""
    caplog.set_level(logging.INFO, logger="vlmserve.http1")
    caplog.clear()
    before = await engine_finished(engine)
    replies, rest = await talk(gw.port, *pieces, replies=replies_before + 1)
    refused = replies[-1]
    assert refused.status == status, refused.body[:300]
    assert refused.error["code"] == code and message in refused.error["message"], refused.error
    assert refused.error["type"] == error_type
    assert refused.headers["connection"] == "close" and rest == b"", rest
    lines = refusal_lines(caplog)
    if logged:
        assert len(lines) == 1 and f"refused with {status}" in lines[0] and "\n" not in lines[0], lines
    else:
        assert lines == []
    assert "Traceback" not in caplog.text
    await control(gw.port)
    assert await engine_finished(engine) == before + 1 + sum(r.json.get("object") == "chat.completion" for r in replies[:-1])
    return replies


# ---- request smuggling and malformed heads --------------------------------------------------------

BODY = unary("smuggled")
CHUNKED_BODY = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
SIZE = b"%x" % len(BODY)


def _case(case_id: str, raw: bytes, status: int, code: str, message: str, what: str) -> Any:
    return pytest.param(raw, status, code, message, id=case_id, marks=pytest.mark.hostile(what))


MALFORMED = "malformed_request"
REFUSED = [
    _case(
        "cl+te",
        post(CHUNKED_BODY, b"Transfer-Encoding: chunked"),
        400,
        MALFORMED,
        "Transfer-Encoding can't be present with Content-Length",
        "request smuggling: Content-Length and Transfer-Encoding: chunked together",
    ),
    _case(
        "two equal content-lengths",
        post(BODY, b"Content-Length: %d" % len(BODY)),
        400,
        MALFORMED,
        "Duplicate Content-Length",
        "request smuggling: Content-Length sent twice with the same value",
    ),
    _case(
        "two different content-lengths",
        post(BODY, b"Content-Length: 2"),
        400,
        MALFORMED,
        "Duplicate Content-Length",
        "request smuggling: Content-Length sent twice with different values",
    ),
    _case(
        "content-length list",
        post(BODY, b"Content-Length: %d, %d" % (len(BODY), len(BODY)), length=False),
        400,
        MALFORMED,
        "Invalid character in Content-Length",
        "request smuggling: a Content-Length list `N, N`",
    ),
    _case(
        "signed content-length",
        post(BODY, b"Content-Length: +%d" % len(BODY), length=False),
        400,
        MALFORMED,
        "Invalid character in Content-Length",
        "request smuggling: a signed Content-Length `+N`",
    ),
    _case(
        "te chunked, identity",
        post(CHUNKED_BODY, b"Transfer-Encoding: chunked, identity", length=False),
        400,
        MALFORMED,
        "Transfer-Encoding",
        "request smuggling: `Transfer-Encoding: chunked, identity`",
    ),
    _case(
        "te identity, chunked",
        post(CHUNKED_BODY, b"Transfer-Encoding: identity, chunked", length=False),
        400,
        MALFORMED,
        "Transfer-Encoding 'identity, chunked' is not supported",
        "request smuggling: `Transfer-Encoding: identity, chunked`",
    ),
    _case(
        "te twice",
        post(CHUNKED_BODY, b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked", length=False),
        400,
        MALFORMED,
        "Transfer-Encoding",
        "request smuggling: Transfer-Encoding sent twice",
    ),
    _case(
        "te xchunked",
        post(CHUNKED_BODY, b"Transfer-Encoding: xchunked", length=False),
        400,
        MALFORMED,
        "Transfer-Encoding 'xchunked' is not supported",
        "request smuggling: an unknown Transfer-Encoding",
    ),
    _case(
        "http/1.0 with te",
        post(CHUNKED_BODY, b"Transfer-Encoding: chunked", b"Connection: keep-alive", version=b"HTTP/1.0", length=False),
        400,
        MALFORMED,
        "HTTP/1.0",
        "request smuggling: Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1)",
    ),
    _case(
        "obs-fold",
        post(BODY, b"X-Folded: first", b" second"),
        400,
        MALFORMED,
        "whitespace",
        "request smuggling: a header continued on the next line (obs-fold)",
    ),
    _case(
        "space before colon",
        post(BODY, b"Content-Length : 5"),
        400,
        MALFORMED,
        "Invalid header field char",
        "request smuggling: whitespace between a header name and its colon",
    ),
    _case(
        "bare lf in the request line",
        b"POST /v1/chat/completions HTTP/1.1\nHost: gateway\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
        400,
        MALFORMED,
        "malformed HTTP request",
        "request smuggling: a bare LF ending the request line",
    ),
    _case(
        "bare lf in a header",
        post(BODY, b"X-A: a\nContent-Length: 0"),
        400,
        MALFORMED,
        "malformed HTTP request",
        "request smuggling: a bare LF inside the header block",
    ),
    _case(
        "bare cr in a header",
        post(BODY, b"X-A: a\rContent-Length: 0"),
        400,
        MALFORMED,
        "malformed HTTP request",
        "request smuggling: a bare CR inside a header value",
    ),
    _case(
        "nul in a header value",
        post(BODY, b"X-A: a\x00b"),
        400,
        MALFORMED,
        "Invalid header value char",
        "a NUL byte in a header value",
    ),
    _case(
        "control byte in a header value",
        post(BODY, b"X-A: a\x01b"),
        400,
        MALFORMED,
        "Invalid header value char",
        "a control byte (0x01) in a header value",
    ),
    _case(
        "del in a header value",
        post(BODY, b"X-A: a\x7fb"),
        400,
        MALFORMED,
        "Invalid header value char",
        "a DEL byte (0x7f) in a header value",
    ),
    _case(
        "nul in the target",
        b"GET /hea\x00lth HTTP/1.1\r\nHost: gateway\r\n\r\n",
        400,
        MALFORMED,
        "malformed HTTP request",
        "a NUL byte in the request target",
    ),
    _case(
        "chunk size 0x1a",
        chunked_post(BODY, b"0x" + SIZE),
        400,
        MALFORMED,
        "Invalid character in chunk size",
        "request smuggling: a chunk size written `0x1a`",
    ),
    _case(
        "chunk size +1a",
        chunked_post(BODY, b"+" + SIZE),
        400,
        MALFORMED,
        "Invalid character in chunk size",
        "request smuggling: a chunk size written `+1a`",
    ),
    _case(
        "chunk size 1_a",
        chunked_post(BODY, SIZE[:1] + b"_" + SIZE[1:]),
        400,
        MALFORMED,
        "Invalid character in chunk size",
        "request smuggling: a chunk size written `1_a`",
    ),
    _case(
        "chunk size overflow",
        chunked_post(BODY, b"f" * 20),
        400,
        MALFORMED,
        "Chunk size overflow",
        "request smuggling: a chunk size of 20 hex digits that overflows 64 bits",
    ),
    _case(
        "two hosts",
        get(b"/health", b"Host: other"),
        400,
        MALFORMED,
        "header 'host' sent more than once",
        "a repeated singleton header: Host twice",
    ),
    _case(
        "two authorizations",
        post(BODY, b"Authorization: Bearer a", b"Authorization: Bearer b"),
        400,
        MALFORMED,
        "header 'authorization' sent more than once",
        "a repeated singleton header: Authorization twice",
    ),
    _case(
        "two request ids",
        post(BODY, b"X-Request-ID: a", b"X-Request-ID: b"),
        400,
        MALFORMED,
        "header 'x-request-id' sent more than once",
        "a repeated singleton header: X-Request-ID twice",
    ),
    _case(
        "no host",
        b"GET /health HTTP/1.1\r\n\r\n",
        400,
        MALFORMED,
        "must carry a Host header",
        "an HTTP/1.1 request without Host (RFC 9112 3.2)",
    ),
    _case(
        "upgrade",
        get(b"/health", b"Connection: Upgrade", b"Upgrade: websocket"),
        400,
        "upgrade_not_supported",
        "protocol upgrades (Upgrade, CONNECT) are not supported",
        "a protocol upgrade (Upgrade: websocket)",
    ),
    _case(
        "connect",
        b"CONNECT replica:8000 HTTP/1.1\r\nHost: replica:8000\r\n\r\n",
        400,
        "upgrade_not_supported",
        "CONNECT",
        "a CONNECT tunnel request",
    ),
    _case(
        "http/2.0 request line",
        get(b"/health", version=b"HTTP/2.0"),
        505,
        "http_version_not_supported",
        "HTTP/2.0 is not supported",
        "an HTTP/2.0 request line",
    ),
    _case(
        "http/0.9 request line",
        b"GET /health\r\n\r\n",
        505,
        "http_version_not_supported",
        "HTTP/0.9 is not supported",
        "an HTTP/0.9 request line (no version)",
    ),
    _case(
        "h2 preface",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        400,
        MALFORMED,
        "malformed HTTP request",
        "an HTTP/2 connection preface sent to the HTTP/1.1 port",
    ),
]


@pytest.mark.parametrize(("raw", "status", "code", "message"), REFUSED)
async def test_refused_framings(
    engine: SimHandle, caplog: pytest.LogCaptureFixture, raw: bytes, status: int, code: str, message: str
) -> None:
    async with running_gateway([engine]) as gw:
        await assert_refused(gw, engine, caplog, raw, status=status, code=code, message=message)
        metrics = (await talk(gw.port, get(b"/metrics", b"Connection: close")))[0][0].body.decode()
    assert "vlmserve_gateway_client_requests_refused_total 1.0" in metrics


ACCEPTED = {
    # (raw request, why it is taken); all carry BODY, whose plain form is the reference
    "chunk size with leading zeros": chunked_post(BODY, SIZE.rjust(20, b"0")),
    "upper-case chunk size": chunked_post(BODY, SIZE.upper()),
    "chunk extensions": chunked_post(BODY, SIZE + b';name=value;quoted="a b"'),
    "one-byte chunks and a trailer": post(
        b"".join(b"1\r\n%c\r\n" % byte for byte in BODY) + b"0\r\nX-Trailer: t\r\n\r\n",
        b"Transfer-Encoding: chunked",
        length=False,
    ),
}


@pytest.mark.hostile(
    "chunk sizes of 20 hex digits with leading zeros, chunk extensions and trailers: read as the "
    "value they spell, the body re-sent with the gateway's own Content-Length"
)
@pytest.mark.parametrize("case", sorted(ACCEPTED))
async def test_accepted_framings_reach_the_engine_as_the_plain_body(engine: SimHandle, case: str) -> None:
    """Another hop could read these differently, which is harmless here: the gateway never passes
    the client's framing on, it re-sends the body it read with its own Content-Length. So the engine
    sees exactly the bytes a plain request carries (same prompt-token count)."""
    async with running_gateway([engine]) as gw:
        before = await engine_finished(engine)
        [plain], _ = await talk(gw.port, post(BODY, b"Connection: close"))
        [framed], rest = await talk(gw.port, ACCEPTED[case], rest_timeout_s=0.3)
        finished = await engine_finished(engine)
    assert plain.status == framed.status == 200, framed.body[:300]
    assert framed.json["usage"]["prompt_tokens"] == plain.json["usage"]["prompt_tokens"]
    assert rest is None  # kept alive: an accepted framing is no reason to close
    assert finished == before + 2


# ---- heads split anywhere -------------------------------------------------------------------------

SPLIT_REQUESTS = {
    "get": get(b"/health", b"Accept: application/json", b"Connection: close"),
    "post": post(unary("split", model="no-such-model"), b"Connection: close"),  # body parsed whole, no engine work
}


@pytest.mark.hostile("request heads (and a body) split at every byte boundary: every split answered as one write")
@pytest.mark.parametrize("which", sorted(SPLIT_REQUESTS))
async def test_every_split_gets_the_answer_of_one_write(engine: SimHandle, which: str) -> None:
    raw = SPLIT_REQUESTS[which]
    async with running_gateway([engine]) as gw:
        [whole], _ = await talk(gw.port, raw)
        expected = whole.normalised()
        for at in range(1, len(raw)):
            [split], rest = await talk(gw.port, raw[:at], raw[at:])
            assert split.normalised() == expected, (at, split.body[:200])
            assert rest == b""
        trickled, _ = await talk(gw.port, *[raw[i : i + 1] for i in range(len(raw))])  # a byte per write
        assert trickled[0].normalised() == expected
    if which == "post":
        assert whole.status == 404 and whole.error["code"] == "model_not_found" and MODEL in whole.error["message"]
    else:
        assert whole.status == 200 and whole.json["status"] == "ok"


@pytest.mark.hostile("a 9 KB request head in one write and split at 9,000 bytes: one limit, one answer")
async def test_a_9kb_head_gets_one_answer_however_it_is_split(engine: SimHandle) -> None:
    raw = post(unary("padded"), b"X-Padding: " + b"p" * 9000, b"Connection: close")
    async with running_gateway([engine]) as gw:
        [whole], _ = await talk(gw.port, raw)
        [split], _ = await talk(gw.port, raw[:9000], raw[9000:])
    assert whole.status == split.status == 200, (whole.body[:200], split.body[:200])
    assert whole.json["object"] == split.json["object"] == "chat.completion"


OVER_LIMIT = post(unary("too big"), b"X-Padding: " + b"p" * HEAD_LIMIT)
NEVER_ENDS = b"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Padding: " + b"p" * (HEAD_LIMIT + 4000)


@pytest.mark.hostile("a request head over the 16 KiB limit, whole, split, or never ending: 431 at once")
@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param((OVER_LIMIT,), id="one write"),
        pytest.param((OVER_LIMIT[:9000], OVER_LIMIT[9000:]), id="split at 9000"),
        pytest.param((OVER_LIMIT[:HEAD_LIMIT], OVER_LIMIT[HEAD_LIMIT:]), id="split at the limit"),
        pytest.param((NEVER_ENDS,), id="never ends, one write"),
        pytest.param((NEVER_ENDS[:100], NEVER_ENDS[100:]), id="never ends, two writes"),
        pytest.param(tuple(NEVER_ENDS[i : i + 4096] for i in range(0, len(NEVER_ENDS), 4096)), id="never ends, 4 KB writes"),
    ],
)
async def test_a_head_over_the_limit_is_refused_431(
    engine: SimHandle, caplog: pytest.LogCaptureFixture, pieces: tuple[bytes, ...]
) -> None:
    """header_timeout_s is long here: a 431 that came only at the header timeout would fail the wait."""
    async with running_gateway([engine], header_timeout_s=60.0) as gw:
        await assert_refused(
            gw,
            engine,
            caplog,
            *pieces,
            status=431,
            code="request_header_fields_too_large",
            message=f"request head over the {HEAD_LIMIT}-byte limit",
        )


# ---- pipelining and Connection: close -------------------------------------------------------------


@pytest.mark.hostile("three pipelined requests in one write: answered in order")
async def test_pipelined_requests_are_answered_in_order(engine: SimHandle) -> None:
    raw = get(b"/health") + post(unary("second")) + get(b"/v1/models", b"Connection: close")
    async with running_gateway([engine]) as gw:
        (health, chat, models), rest = await talk(gw.port, raw, replies=3)
    assert [health.status, chat.status, models.status] == [200, 200, 200]
    assert health.json["status"] == "ok" and chat.json["object"] == "chat.completion"
    assert models.json["object"] == "list" and [m["id"] for m in models.json["data"]] == [MODEL]
    assert "connection" not in health.headers and models.headers["connection"] == "close" and rest == b""


ASYNCIO_READ_BYTES = 256 * 1024  # the most asyncio's socket transport reads at once (selector_events.max_size)


@pytest.mark.hostile(
    "a client that pipelines thousands of requests and reads its answers slowly, or not at all: "
    "the gateway's queue and write buffer stay bounded"
)
async def test_a_pipelining_client_that_does_not_read_holds_bounded_memory(engine: SimHandle) -> None:
    """Reading pauses while answers wait to be written or requests to be served, and resumes only
    once both are back under their limits. Before, answers piled up in the write buffer (GET
    /metrics: about 170 times the bytes of the requests) and each answer resumed reading."""
    from vlmserve.http1.server import MAX_QUEUED_REQUESTS

    metrics, health = get(b"/metrics"), get(b"/health")
    count = 3000
    async with running_gateway([engine]) as gw:
        reader, writer = await connect(gw.port)
        client = writer.transport
        assert isinstance(client, asyncio.Transport)
        client.pause_reading()  # reads nothing: kernel buffers fill, then the gateway's
        writer.write(metrics * count)
        connection = next(iter(gw.http.connections))
        for _ in range(500):  # until the gateway is held up by the client
            if connection.writing_paused:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # a moment in which it would have gone on writing
        assert connection.transport is not None
        held = connection.transport.get_write_buffer_size()
        client.resume_reading()
        answers = [await read_reply(reader) for _ in range(count)]
        writer.write(health * 40000)  # 1.3 MB of small requests, whose answers are read slowly
        most_queued = 0
        for n in range(40000):
            most_queued = max(most_queued, len(connection.queue))
            assert (await read_reply(reader)).status == 200
            if n % 20 == 0:
                await asyncio.sleep(0.001)
        writer.close()
    assert connection.writing_paused is False and held < 1024 * 1024, held
    assert all(a.status == 200 and a.body.startswith(b"#") for a in answers)
    assert most_queued <= ASYNCIO_READ_BYTES // len(health) + MAX_QUEUED_REQUESTS, most_queued


@pytest.mark.hostile("a client that pipelines requests and never reads an answer: dropped after the keep-alive timeout")
async def test_a_pipelining_client_that_never_reads_is_dropped(engine: SimHandle) -> None:
    async with running_gateway([engine], keepalive_timeout_s=1.0) as gw:
        reader, writer = await connect(gw.port)
        client = writer.transport
        assert isinstance(client, asyncio.Transport)
        client.pause_reading()
        for _ in range(3):  # in parts: requests also arrive while the gateway waits for the client
            writer.write(get(b"/metrics") * 1000)
            await asyncio.sleep(0.1)
        connection = next(iter(gw.http.connections))
        for _ in range(500):
            if connection.writing_paused:
                break
            await asyncio.sleep(0.01)
        assert connection.writing_paused
        for _ in range(500):
            if gw.gateway.client_stats.open == 0:
                break
            await asyncio.sleep(0.01)
        writer.close()
        assert gw.gateway.client_stats.open == 0 and connection.transport is None


@pytest.mark.hostile("Connection: close followed by pipelined bytes: the first request answered, the rest never read")
@pytest.mark.parametrize(
    "following",
    [b"garbage\r\n\r\n", post(unary("never")), get(b"/health", b"X-A: \x00")],
    ids=["garbage", "a second request", "a malformed request"],
)
async def test_connection_close_answers_the_first_request_only(
    engine: SimHandle, caplog: pytest.LogCaptureFixture, following: bytes
) -> None:
    caplog.set_level(logging.INFO, logger="vlmserve.http1")
    async with running_gateway([engine]) as gw:
        before = await engine_finished(engine)
        [first], rest = await talk(gw.port, post(unary("first"), b"Connection: close") + following)
        finished = await engine_finished(engine)
    assert first.status == 200 and first.json["object"] == "chat.completion"
    assert first.headers["connection"] == "close" and rest == b""
    assert finished == before + 1  # the second request never reached the engine
    assert refusal_lines(caplog) == []  # nothing after the last request was parsed, so nothing refused


@pytest.mark.hostile("a malformed request pipelined after good ones: the good ones answered first, then the 400")
async def test_a_refusal_after_pipelined_requests_waits_for_their_answers(
    engine: SimHandle, caplog: pytest.LogCaptureFixture
) -> None:
    raw = post(unary("good")) + get(b"/health") + get(b"/health", b"X-A: \x00")
    async with running_gateway([engine]) as gw:
        chat, health, _ = await assert_refused(
            gw, engine, caplog, raw, status=400, code=MALFORMED, message="Invalid header value char", replies_before=2
        )
    assert chat.json["object"] == "chat.completion" and health.json["status"] == "ok"


# ---- HTTP/1.0 -------------------------------------------------------------------------------------


@pytest.mark.hostile("HTTP/1.0 keep-alive: two requests on one connection with Connection: keep-alive, closed without")
async def test_http10_keeps_alive_only_when_asked(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        reader, writer = await connect(gw.port)
        try:
            writer.write(get(b"/health", b"Connection: keep-alive", version=b"HTTP/1.0"))
            first = await read_reply(reader)
            writer.write(post(unary("ten"), b"Connection: keep-alive", version=b"HTTP/1.0"))
            second = await read_reply(reader)
            writer.write(get(b"/health", version=b"HTTP/1.0"))  # no keep-alive: the last one
            third = await read_reply(reader)
            rest = await read_rest(reader)
        finally:
            writer.close()
    assert [first.status, second.status, third.status] == [200, 200, 200]
    assert first.headers["connection"] == second.headers["connection"] == "keep-alive"
    assert second.json["object"] == "chat.completion"
    assert third.headers["connection"] == "close" and rest == b""


# ---- Expect ---------------------------------------------------------------------------------------


@pytest.mark.hostile("Expect: 100-continue: the 100 before the body is sent, then the answer")
@pytest.mark.parametrize("expect", [b"Expect: 100-continue", b"Expect: 100-Continue  "], ids=["plain", "case and OWS"])
async def test_expect_100_continue(engine: SimHandle, expect: bytes) -> None:
    raw = post(unary("expect"), expect, b"Connection: close")
    head, body = raw.split(b"\r\n\r\n", 1)
    async with running_gateway([engine]) as gw:
        reader, writer = await connect(gw.port)
        try:
            writer.write(head + b"\r\n\r\n")
            interim = await read_reply(reader)  # the body is not sent before the 100 came
            writer.write(body)
            answer = await read_reply(reader)
            rest = await read_rest(reader)
        finally:
            writer.close()
    assert interim.status == 100 and interim.headers == {}
    assert answer.status == 200 and answer.json["object"] == "chat.completion" and rest == b""


async def test_expect_is_ignored_in_http10_requests(engine: SimHandle) -> None:
    """RFC 9110 10.1.1: an HTTP/1.0 client may not understand a 100, so none is sent (nor a 417)."""
    async with running_gateway([engine]) as gw:
        replies, rest = await talk(gw.port, post(unary("ten"), b"Expect: 100-continue", version=b"HTTP/1.0"))
        [other], _ = await talk(gw.port, get(b"/health", b"Expect: something-else", version=b"HTTP/1.0"))
    assert [r.status for r in replies] == [200] and replies[0].json["object"] == "chat.completion"
    assert rest == b"" and other.status == 200


@pytest.mark.hostile("Expect: 100-continue on a request pipelined behind another: the 100 after the answer before it")
async def test_a_pipelined_100_continue_follows_the_answer_before_it(engine: SimHandle) -> None:
    """A 1xx belongs to the request at the head of the line (RFC 9110 15.2): written at once, the
    100 reached the client before the first request's answer, which a client takes for its own."""
    first = post(unary("first", max_tokens=100))  # takes the engine about 0.1 s
    head, body = post(unary("second"), b"Expect: 100-continue", b"Connection: close").split(b"\r\n\r\n", 1)
    async with running_gateway([engine]) as gw:
        reader, writer = await connect(gw.port)
        try:
            writer.write(first + head + b"\r\n\r\n")
            answer = await read_reply(reader)
            interim = await read_reply(reader)
            writer.write(body)
            second = await read_reply(reader)
            rest = await read_rest(reader)
        finally:
            writer.close()
    assert answer.status == 200 and answer.json["choices"][0]["message"]["content"]
    assert interim.status == 100
    assert second.status == 200 and second.json["object"] == "chat.completion" and rest == b""


@pytest.mark.hostile("Expect: 100-continue with a body over --max-body-bytes: 413 and no 100")
async def test_expect_100_continue_over_the_body_limit(engine: SimHandle, caplog: pytest.LogCaptureFixture) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
    async with running_gateway([engine], max_body_bytes=BODY_LIMIT) as gw:
        [answer] = await assert_refused(
            gw,
            engine,
            caplog,
            head % (BODY_LIMIT + 1),
            status=413,
            code="body_too_large",
            message=f"request body is {BODY_LIMIT + 1} bytes over the {BODY_LIMIT}-byte limit",
        )
    assert answer.status == 413  # read_reply would have returned the 100 first


@pytest.mark.hostile("Expect with anything but 100-continue: 417")
async def test_other_expectations_get_417(engine: SimHandle, caplog: pytest.LogCaptureFixture) -> None:
    async with running_gateway([engine]) as gw:
        await assert_refused(
            gw,
            engine,
            caplog,
            post(unary(), b"Expect: something-else"),
            status=417,
            code="expectation_failed",
            message="Expect 'something-else' is not supported",
        )


# ---- bodies ---------------------------------------------------------------------------------------


@pytest.mark.hostile("a Content-Length over --max-body-bytes: 413 before the body is read")
async def test_an_announced_oversized_body_is_refused_before_it_is_read(
    engine: SimHandle, caplog: pytest.LogCaptureFixture
) -> None:
    announced = post(b"", length=False).replace(b"\r\n\r\n", b"\r\nContent-Length: 10000000\r\n\r\n")
    async with running_gateway([engine], max_body_bytes=BODY_LIMIT) as gw:
        await assert_refused(
            gw,
            engine,
            caplog,
            announced,
            status=413,
            code="body_too_large",
            message=f"10000000 bytes over the {BODY_LIMIT}-byte limit: send smaller images or raise",
        )


@pytest.mark.hostile("a chunked body that grows past --max-body-bytes: 413 once it passes the limit")
async def test_a_chunked_body_over_the_limit_is_refused(engine: SimHandle, caplog: pytest.LogCaptureFixture) -> None:
    pieces = [post(b"", b"Transfer-Encoding: chunked", length=False)] + [b"400\r\n" + b"a" * 1024 + b"\r\n"] * 6
    async with running_gateway([engine], max_body_bytes=BODY_LIMIT) as gw:
        await assert_refused(
            gw,
            engine,
            caplog,
            *pieces,
            status=413,
            code="body_too_large",
            message=f"request body is over the {BODY_LIMIT}-byte limit",
        )


ENDLESS_TRAILER = [post(b"", b"Transfer-Encoding: chunked", length=False) + b"2\r\n{}\r\n0\r\nX-Trailer: "] + [b"t" * 4096] * 8
ENDLESS_EXTENSION = [post(b"", b"Transfer-Encoding: chunked", length=False) + b"2;ext="] + [b"e" * 4096] * 8


@pytest.mark.hostile(
    "a chunked body whose trailer, or chunk extension, never ends: refused past a head's size, never buffered without limit"
)
@pytest.mark.parametrize("pieces", [ENDLESS_TRAILER, ENDLESS_EXTENSION], ids=["trailer", "chunk extension"])
async def test_chunk_framing_without_end_is_refused(
    engine: SimHandle, caplog: pytest.LogCaptureFixture, pieces: list[bytes]
) -> None:
    async with running_gateway([engine], header_timeout_s=60.0) as gw:
        await assert_refused(
            gw,
            engine,
            caplog,
            *pieces,
            status=400,
            code=MALFORMED,
            message="more bytes of chunk framing, extensions or trailers than of data",
        )


@pytest.mark.hostile("more than 100 header fields: 431")
async def test_too_many_header_fields_get_431(engine: SimHandle, caplog: pytest.LogCaptureFixture) -> None:
    raw = get(b"/health", *[b"X-Field-%d: v" % n for n in range(101)])
    async with running_gateway([engine]) as gw:
        await assert_refused(
            gw, engine, caplog, raw, status=431, code="request_header_fields_too_large", message="more than 100 header fields"
        )


@pytest.mark.hostile("a client that stops sending in the middle of its body: 408 once header_timeout_s passes without a byte")
async def test_a_stalled_body_gets_408(engine: SimHandle, caplog: pytest.LogCaptureFixture) -> None:
    raw = post(unary("stalls"))
    async with running_gateway([engine], header_timeout_s=1.0) as gw:
        started = asyncio.get_running_loop().time()
        await assert_refused(
            gw,
            engine,
            caplog,
            raw[:-10],
            status=408,
            code="request_timeout",
            message="request body not received in time",
            error_type="timeout_error",
            logged=False,
        )
        elapsed = asyncio.get_running_loop().time() - started
    assert elapsed < 5.0


async def test_a_steady_slow_body_is_not_cut_by_the_header_timeout(engine: SimHandle) -> None:
    """The head's deadline does not run on into the body: a body arriving steadily, for longer in
    all than header_timeout_s, is served (before, it got a 408 'headers not received in time')."""
    raw = post(unary("steady"), b"Connection: close")
    head_end = raw.index(b"\r\n\r\n") + 4
    pieces = [raw[:head_end]] + [raw[i : i + 16] for i in range(head_end, len(raw), 16)]
    async with running_gateway([engine], header_timeout_s=0.6) as gw:
        reader, writer = await connect(gw.port)
        started = asyncio.get_running_loop().time()
        await send(writer, *pieces, pause_s=0.15)
        elapsed = asyncio.get_running_loop().time() - started
        answer = await read_reply(reader)
        writer.close()
    assert elapsed > 2 * 0.6 and answer.status == 200 and answer.json["object"] == "chat.completion", answer.body[:200]


async def test_a_body_that_arrives_in_pieces_is_served(engine: SimHandle) -> None:
    raw = post(unary("slow body"), b"Connection: close")
    async with running_gateway([engine]) as gw:
        [answer], rest = await talk(gw.port, *[raw[i : i + 17] for i in range(0, len(raw), 17)])
    assert answer.status == 200 and answer.json["object"] == "chat.completion" and rest == b""


# ---- errors the gateway's handler answers: the connection stays usable ------------------------------


async def test_handler_errors_are_openai_errors_on_a_kept_alive_connection(engine: SimHandle) -> None:
    """Refusals of the request's content (not of its framing) keep the connection: its framing was sound."""
    raw = (
        post(b"{not json")
        + post(b"[1, 2]")
        + post(unary("x", model="no-such-model"))
        + post(b"{}", path=b"/v1/%2e%2e/chat/completions")
        + post(unary("q"), path=b"/v1/chat/completions?x=1")
        + get(b"/metrics", method=b"POST")
    )
    async with running_gateway([engine]) as gw:
        replies, still_open = await talk(gw.port, raw, replies=6, rest_timeout_s=0.3)
        reader, writer = await connect(gw.port)
        writer.write(get(b"/health", b"Connection: close", method=b"HEAD"))
        head = await read_reply(reader, head_only=True)
        rest = await read_rest(reader)
        writer.close()
    bad_json, not_object, unknown_model, encoded_dot, query, wrong_method = replies
    assert (bad_json.status, bad_json.error["code"]) == (400, "invalid_json")
    assert "not valid JSON" in bad_json.error["message"]
    assert (not_object.status, not_object.error["code"]) == (400, "invalid_json")
    assert (unknown_model.status, unknown_model.error["code"]) == (404, "model_not_found")
    assert (encoded_dot.status, encoded_dot.error["code"]) == (400, "invalid_path")
    assert query.status == 200 and query.json["object"] == "chat.completion"
    assert (wrong_method.status, wrong_method.error["code"]) == (405, "method_not_allowed")
    assert not any("connection" in r.headers for r in replies) and still_open is None
    assert head.status == 200 and int(head.headers["content-length"]) > 0 and rest == b""  # HEAD: no body bytes


@pytest.mark.hostile("an X-Request-ID that is not Latin-1, not ASCII, too long or holds spaces: a 400, never a 500")
@pytest.mark.parametrize(
    "value",
    ["req-\u20ac".encode(), b"caf\xe9", b"r" * 129, b"two words"],
    ids=["utf-8 euro sign", "latin-1 byte", "129 chars", "space"],
)
async def test_bad_client_request_ids_get_a_400(engine: SimHandle, caplog: pytest.LogCaptureFixture, value: bytes) -> None:
    async with running_gateway([engine]) as gw:
        before = await engine_finished(engine)
        [answer], rest = await talk(gw.port, post(unary(), b"X-Request-ID: " + value, b"Connection: close"))
        await control(gw.port)
        finished = await engine_finished(engine)
    assert answer.status == 400 and answer.error["code"] == "invalid_request_id"
    assert "X-Request-ID" in answer.error["message"] and rest == b""
    assert finished == before + 1 and "Traceback" not in caplog.text


async def test_trailing_whitespace_is_not_part_of_a_header_value(engine: SimHandle) -> None:
    """RFC 9110 5.5: a field value excludes leading and trailing whitespace (llhttp drops the leading only)."""
    async with running_gateway([engine]) as gw:
        [answer], _ = await talk(gw.port, post(unary(), b"X-Request-ID: order-17 \t", b"Connection: close"))
    assert answer.status == 200 and answer.headers["x-client-request-id"] == "order-17"


# ---- half-closed and vanished clients -------------------------------------------------------------


@pytest.mark.hostile("a client that shuts its sending side (SHUT_WR) after a whole GET still gets its answer")
async def test_a_half_closed_client_gets_its_get_answered(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        [answer], rest = await talk(gw.port, get(b"/health"), shut_write=True)
    assert answer.status == 200 and answer.json["status"] == "ok" and rest == b""


@pytest.mark.hostile(
    "a client that sends engine work and shuts its sending side (SHUT_WR): taken to have left, "
    "the work is cancelled (no generation queued for a client that hung up), the gateway serves on"
)
async def test_engine_work_from_a_half_closed_client_is_cancelled(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw:
        reader, writer = await connect(gw.port)
        writer.write(post(unary("x", max_tokens=8000)))
        writer.write_eof()
        received = await read_rest(reader)
        writer.close()
        await _settled(gw, within_s=2.0)  # the engine would take 8 s to finish it
        await control(gw.port)
    assert received == b""  # closed, no answer: documented in docs/gateway.md


async def _settled(gw: Any, within_s: float) -> None:
    """The gateway holds nothing of a request whose client left, within `within_s`: well before the
    engine would have finished it had it not been cancelled."""
    gateway = gw.gateway
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if gateway.requests_in_progress == 0 and all(r.in_flight == 0 for r in gateway.pool.replicas):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the gateway still holds the request of a client that left")


@pytest.mark.hostile("a client that vanishes while its request is served: the request is cancelled")
@pytest.mark.parametrize(
    ("stream", "padding"), [(False, 0), (True, 0), (False, 1 << 20)], ids=["unary", "streamed", "unary with a 1 MiB body"]
)
async def test_a_client_gone_mid_request_cancels_it(engine: SimHandle, stream: bool, padding: int) -> None:
    """A body larger than the pipelining bound (MAX_QUEUED_BYTES) paused reading while it queued:
    the client's leaving is still seen once its request is being served."""
    body = json.dumps(chat_body("long", max_tokens=8000, stream=stream, user="u" * padding)).encode()  # 8 s of the engine's time
    async with running_gateway([engine]) as gw:
        aborted = await engine_finished(engine, "abort")
        reader, writer = await connect(gw.port)
        writer.write(post(body))
        if stream:  # under way: the head of a 200 event stream came
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REPLY_TIMEOUT_S)
            assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head, head
        else:
            for _ in range(200):
                if gw.gateway.requests_in_progress:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # forwarded to the engine by now
        writer.transport.abort()
        await _settled(gw, within_s=2.0)
        for _ in range(100):  # the engine saw the replica connection close and aborted the request
            if await engine_finished(engine, "abort") == aborted + 1:
                break
            await asyncio.sleep(0.02)
    assert await engine_finished(engine, "abort") == aborted + 1


# ---- connection lifetime --------------------------------------------------------------------------


def _connection_tasks() -> list[asyncio.Task]:
    return [task for task in asyncio.all_tasks() if getattr(task.get_coro(), "__qualname__", "") == "HttpConnection._serve"]


async def test_one_task_serves_a_connections_requests_and_ends_with_it(engine: SimHandle) -> None:
    """Kept-alive requests are served in turn by one task, which holds nothing of the last request
    while the connection idles, and ends when the connection closes."""
    async with running_gateway([engine]) as gw:
        reader, writer = await connect(gw.port)
        tasks = []
        for i in range(3):
            writer.write(post(unary(f"turn {i}")) if i != 1 else get(b"/health"))
            assert (await read_reply(reader)).status == 200
            tasks.append(_connection_tasks())
        assert len(tasks[0]) == 1 and tasks[0] == tasks[1] == tasks[2]
        await asyncio.sleep(0.05)
        gc.collect()
        held = [o for o in gc.get_objects() if isinstance(o, (Request, Response))]
        assert held == []  # the idle task keeps neither the last request (nor its body) nor its answer
        writer.close()  # the client leaves while the connection idles
        for _ in range(100):
            if not _connection_tasks():
                break
            await asyncio.sleep(0.02)
        assert _connection_tasks() == []
        assert gw.gateway.client_stats.open == 0


@pytest.mark.hostile("a kept-alive connection whose next head never completes: 408 after the header timeout")
async def test_a_later_head_that_never_completes_gets_408(engine: SimHandle) -> None:
    async with running_gateway([engine], header_timeout_s=1.0, keepalive_timeout_s=30.0) as gw:
        reader, writer = await connect(gw.port)
        try:
            writer.write(get(b"/health"))
            first = await read_reply(reader)
            await asyncio.sleep(1.5)  # idle longer than a head may take: the keep-alive timeout applies
            writer.write(b"GET /health HTTP/1.1\r\nHost: gate")
            started = asyncio.get_running_loop().time()
            timed_out = await read_reply(reader)
            elapsed = asyncio.get_running_loop().time() - started
            rest = await read_rest(reader)
        finally:
            writer.close()
    assert first.status == 200
    assert timed_out.status == 408 and timed_out.error["message"] == "request headers not received in time"
    assert 0.8 < elapsed < 3.0 and rest == b""


@pytest.mark.hostile("a head sent in slow parts: the header timeout counts from its first byte, not from each part")
async def test_a_head_sent_in_parts_keeps_only_the_time_left(engine: SimHandle) -> None:
    async with running_gateway([engine], header_timeout_s=1.5) as gw:
        reader, writer = await connect(gw.port)
        loop = asyncio.get_running_loop()
        started = loop.time()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n")
        await asyncio.sleep(1.0)
        writer.write(b"Expect: 100-continue\r\nX-More: ")
        answer = await read_reply(reader)
        elapsed = loop.time() - started
        writer.close()
    assert answer.status == 408 and answer.error["code"] == "request_timeout"
    assert elapsed < 2.5
