"""The native pump (_native_relay.c) on socket pairs, without an event loop: each guarantee and
each hostile replica or client, checked against the bytes on the wire.

`replica` and `client` are the far ends of two socket pairs; the pump holds the near ends (it
duplicates them, as the gateway's transports keep theirs). `drive` stands in for the event
loop: it waits for the pump's epoll descriptor and calls `run_once` until the stream ends.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from vlmserve.gateway import native_pump
from vlmserve.gateway.native_pump import PumpResult

native = native_pump._native_relay
pytestmark = pytest.mark.skipif(native is None, reason="the native relay is not built in this install")


def frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


EVENT = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n'
END = b"0\r\n\r\n"


@dataclass
class Rig:
    pump: Any  # _native_relay.Pump
    handle: int
    replica: socket.socket  # what the replica writes
    client: socket.socket  # what the client reads
    ends: list[socket.socket]


@contextmanager
def rig(client_buffer: int | None = None) -> Iterator[Rig]:
    replica_far, replica_near = socket.socketpair()
    client_near, client_far = socket.socketpair()
    if client_buffer is not None:
        client_near.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, client_buffer)
        client_far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, client_buffer)
    for s in (replica_near, client_near):
        s.setblocking(False)
    pump = native.Pump()
    handle = pump.start(replica_near.fileno(), client_near.fileno())
    ends = [replica_far, replica_near, client_near, client_far]
    try:
        yield Rig(pump, handle, replica_far, client_far, ends)
    finally:
        pump.close()
        for s in ends:
            s.close()


def drive(r: Rig, timeout_s: float = 5.0) -> PumpResult:
    """Serve the pump until its stream ends (the event loop's part)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        select.select([r.pump.fileno()], [], [], 0.05)
        for handle, raw in r.pump.run_once():
            assert handle == r.handle
            return PumpResult(*raw)
    raise AssertionError("the stream did not end")


def turn(r: Rig, times: int = 3) -> None:
    """A few loop turns with no end expected."""
    for _ in range(times):
        select.select([r.pump.fileno()], [], [], 0.02)
        assert r.pump.run_once() == []


def received(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    out = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def test_whole_frames_pass_as_they_came_and_the_end_is_written() -> None:
    with rig() as r:
        body = frame(EVENT) + frame(EVENT)
        r.replica.sendall(body)
        turn(r)
        assert received(r.client) == body
        r.replica.sendall(frame(USAGE) + END)
        result = drive(r)
        assert result.completed and not result.trailing and result.chunks == 2
        assert received(r.client) == frame(USAGE) + END
        assert result.usage_block == frame(USAGE) and result.usage_prev == b""


def test_an_incomplete_frame_is_held_until_it_is_whole() -> None:
    with rig() as r:
        whole = frame(EVENT * 100)
        r.replica.sendall(whole[:7])
        turn(r)
        assert received(r.client) == b""
        r.replica.sendall(whole[7:-1])
        turn(r)
        assert received(r.client) == b""
        r.replica.sendall(whole[-1:] + END)
        assert drive(r).completed
        assert received(r.client) == whole + END


def test_a_usage_event_cut_between_frames_is_kept_whole() -> None:
    with rig() as r:
        cut = USAGE.index(b'"usage"') - 3
        first, second = frame(USAGE[:cut]), frame(USAGE[cut:])
        for piece in (frame(EVENT), first, second):
            r.replica.sendall(piece)
            turn(r, 2)
        r.replica.sendall(END)
        result = drive(r)
        assert result.usage_prev == first and result.usage_block == second


def test_bytes_after_the_end_are_not_passed_and_mark_the_connection() -> None:
    with rig() as r:
        r.replica.sendall(frame(EVENT) + END + b"HTTP/1.1 200 OK\r\n\r\n")
        result = drive(r)
        assert result.completed and result.trailing
        assert received(r.client) == frame(EVENT) + END


def test_trailers_end_the_body() -> None:
    with rig() as r:
        r.replica.sendall(frame(EVENT) + b"0\r\nX-Trailer: 1\r\n\r\n")
        result = drive(r)
        assert result.completed and not result.trailing
        assert received(r.client) == frame(EVENT) + END  # the end as the gateway writes it, trailers dropped


@pytest.mark.hostile("the native pump and a replica that closes, resets or sends malformed chunk framing (not hex, signed, "
                     "no CRLF, an endless size line, a 32 MiB frame, 17 hex digits): the stream ends on a frame boundary "
                     "with the failure named, nothing buffered past 16 MiB")
@pytest.mark.parametrize(("tail", "failure", "why"), [
    (b"", "FAIL_CLOSED", "closed the connection mid-stream"),
    (frame(EVENT)[:9], "FAIL_CLOSED", "closed the connection mid-stream"),
    (b"zz\r\nnot a frame\r\n", "FAIL_BAD_SIZE_LINE", "sent a malformed body (bad chunk size line b'zz')"),
    (b"-5\r\nhello\r\n", "FAIL_BAD_SIZE_LINE", "sent a malformed body (bad chunk size line b'-5')"),
    (b"5\r\nhelloXX", "FAIL_NO_CRLF", "sent a malformed body (chunk not followed by CRLF)"),
    (b"7" * 2000, "FAIL_SIZE_LINE_LONG", "sent a malformed body (chunk size line too long)"),
    (b"2000000\r\n" + b"y" * 1000, "FAIL_FRAME_TOO_LONG", "sent a malformed body (a chunk over 16 MiB)"),
    (b"fffffffffffffffff\r\n", "FAIL_BAD_SIZE_LINE", "sent a malformed body (bad chunk size line b'fffffffffffffffff')"),
])
def test_a_failing_replica_ends_the_stream_on_a_frame_boundary(tail: bytes, failure: str, why: str) -> None:
    with rig() as r:
        r.replica.sendall(frame(EVENT))
        turn(r)
        r.replica.sendall(tail)
        r.replica.shutdown(socket.SHUT_WR)
        result = drive(r)
        assert result.upstream_failed and result.failure == getattr(native, failure)
        assert result.why() == why
        assert received(r.client) == frame(EVENT)  # nothing of the broken part reached the client


def test_a_reset_replica_names_the_error() -> None:
    with rig() as r:
        r.replica.sendall(frame(EVENT))
        turn(r)
        r.replica.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        r.replica.close()  # with linger 0: a reset on TCP, a plain close on a Unix pair
        result = drive(r)
        assert result.upstream_failed and result.why() in ("closed the connection mid-stream",
                                                           "failed mid-stream (ConnectionResetError)")


@pytest.mark.hostile("a client hangs up while the native pump holds its stream: the stream ends at once")
def test_a_client_that_hangs_up_ends_the_stream_at_once() -> None:
    with rig() as r:
        r.replica.sendall(frame(EVENT))
        turn(r)
        r.client.close()
        result = drive(r, timeout_s=1.0)
        assert result.end == native.END_CLIENT_GONE


def test_a_full_client_socket_stops_the_reading_and_nothing_is_lost() -> None:
    """The client reads nothing: the pump holds at most one read and stops reading the replica,
    whose socket then fills; once the client reads, everything arrives in order."""
    with rig(client_buffer=4096) as r:
        r.replica.setblocking(False)
        payload = frame(b"data: " + b"z" * 3000 + b"\n\n")
        sent = 0
        for _ in range(4000):  # 12 MB offered
            try:
                r.replica.send(payload)
            except BlockingIOError:
                break
            sent += 1
            if sent % 50 == 0:
                turn(r, 1)
        turn(r, 5)
        assert sent < 4000, "the replica's socket never filled: the pump kept reading"
        r.replica.setblocking(True)
        got = b""
        r.client.setblocking(False)
        deadline = time.monotonic() + 20
        finished = None
        end_sent = False
        while finished is None and time.monotonic() < deadline:
            select.select([r.pump.fileno(), r.client], [], [], 0.02)
            got += received(r.client)
            for _, raw in r.pump.run_once():
                finished = PumpResult(*raw)
            if not end_sent and len(got) >= (sent - 5) * len(payload):
                r.replica.sendall(END)
                end_sent = True
        got += received(r.client)
        assert finished is not None and finished.completed
        assert got == payload * sent + END


def test_cancel_lets_go_of_the_sockets_and_reports_once() -> None:
    with rig() as r:
        r.replica.sendall(frame(EVENT) + frame(EVENT)[:5])
        turn(r)
        before = len(os.listdir("/proc/self/fd"))
        raw = r.pump.cancel(r.handle)
        assert raw is not None
        result = PumpResult(*raw)
        assert result.end == native.END_CANCELLED and result.held == frame(EVENT)[:5] and result.chunks == 1
        assert len(os.listdir("/proc/self/fd")) == before - 2  # its two duplicates are closed
        assert r.pump.cancel(r.handle) is None and r.pump.chunks(r.handle) == 0  # a stale handle is inert
        r.replica.sendall(frame(EVENT) + END)
        turn(r)  # the pump no longer reads that socket: nothing more reaches the client
        assert received(r.client) == frame(EVENT)


def test_a_closed_pump_refuses_new_streams() -> None:
    pump = native.Pump()
    pump.close()
    a, b = socket.socketpair()
    with a, b, pytest.raises(RuntimeError, match="the pump is closed"):
        pump.start(a.fileno(), b.fileno())


def test_a_bad_descriptor_is_an_os_error() -> None:
    pump = native.Pump()
    with pytest.raises(OSError):
        pump.start(-1, 0)
    pump.close()
