"""The native pump (native_pump.py, _native_relay.c) keeps the relay's guarantees once it holds a stream.

Each case scripts a replica (test_relay.py's scripted server, on a real socket) whose first
frames arrive one per read, so the stream reaches its steady state and is handed to the pump;
what follows (frames split or merged, usage cut between frames, a replica that dies, sends a
malformed frame or stalls) is then the pump's to handle. Each case runs with `--relay native`
and `--relay python`, and both must give the client the same answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway
from tests.integration.gateway.conftest import pumped
from tests.integration.gateway.test_relay import SSE_HEAD, frame, scripted_replica, send, token
from vlmserve.errors import UserError
from vlmserve.gateway import native_pump
from vlmserve.gateway.config import GatewayConfig

HEAD_FRAMES = [frame(token(f"t{i}")) for i in range(4)]  # one per read: the stream is pumped from the second on
USAGE = token("", {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12})
END = frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
TOKENS = [f"t{i}" for i in range(4)]


def texts(result) -> list[str]:
    return [e["choices"][0]["delta"]["content"] for e in result.events if e.get("choices")]


async def run_script(relay: str, *pieces: bytes, abort: bool = False, pause_s: float = 0.03, **settings) -> tuple:
    """The client's view of one streamed answer whose body is SSE_HEAD + HEAD_FRAMES + pieces."""

    async def script(writer: asyncio.StreamWriter) -> None:
        await send(writer, SSE_HEAD + HEAD_FRAMES[0])
        await send(writer, *HEAD_FRAMES[1:], *pieces, pause_s=pause_s)
        if abort:
            writer.transport.abort()
        else:
            await asyncio.sleep(5)  # a replica that stalls: the gateway must end it

    async with scripted_replica(script) as replica, running_gateway([replica.url], relay=relay, **settings) as gw, \
            aiohttp.ClientSession() as session:
        result = await post_chat(session, gw.base_url, chat_body("q"))
        metrics = await (await session.get(gw.base_url + "/metrics")).text()
        carried = pumped(gw)
    if relay == "native":
        assert carried == 1, "the stream never reached the native pump"
        assert "vlmserve_gateway_native_relay_streams_total 1.0" in metrics
    else:
        assert carried == 0
    return result, metrics


def test_the_native_relay_is_built_here() -> None:
    """On Linux the install compiles the pump (setup.py); a missing compiler would silently leave
    every gateway on the Python relay, so this says so instead."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the native relay is built on Linux only")
    assert native_pump.native_available(), "vlmserve.gateway._native_relay did not build: is a C compiler installed?"


async def test_an_answer_with_usage_arrives_whole(relay: str, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    result, _ = await run_script(relay, frame(token("t4")), frame(USAGE), END, audit_log=audit)
    assert result.status == 200 and result.done and result.error is None
    assert texts(result) == TOKENS + ["t4", ""]
    record = json.loads(audit.read_text().splitlines()[0])
    assert (record["prompt_tokens"], record["completion_tokens"]) == (5, 7)


@pytest.mark.parametrize("shape", ["split frame", "merged frames", "usage cut between frames", "end split"])
async def test_frames_cut_and_merged_after_the_hand_over(relay: str, shape: str, tmp_path: Path) -> None:
    late = frame(token("x" * 5000))
    usage_event = token("", {"completion_tokens": 9, "prompt_tokens": 4, "total_tokens": 13})
    cut_at = usage_event.index(b'"usage"') - 3
    pieces = {
        "split frame": [late[:10], late[10:3000], late[3000:], END],
        "merged frames": [late + frame(token("y")) + frame(token("z")), END],
        "usage cut between frames": [frame(usage_event[:cut_at]), frame(usage_event[cut_at:]), END],
        "end split": [late, END[:4], END[4:-2], END[-2:]],
    }[shape]
    audit = tmp_path / "audit.jsonl"
    result, _ = await run_script(relay, *pieces, audit_log=audit)
    assert result.status == 200 and result.done and result.error is None
    expected = {"split frame": ["x" * 5000], "merged frames": ["x" * 5000, "y", "z"],
                "usage cut between frames": [""], "end split": ["x" * 5000]}[shape]
    assert texts(result) == TOKENS + expected
    if shape == "usage cut between frames":
        record = json.loads(audit.read_text().splitlines()[0])
        assert (record["prompt_tokens"], record["completion_tokens"]) == (4, 9)


@pytest.mark.hostile("a replica dies or sends a malformed frame while the native pump holds the stream: the client gets "
                     "the whole frames so far and one error event, never a partial frame")
@pytest.mark.parametrize("tail", ["between frames", "mid frame", "malformed frame", "bad size line", "no CRLF after a frame"])
async def test_a_replica_failing_under_the_pump_ends_with_an_error_event(relay: str, tail: str) -> None:
    piece = {"between frames": b"", "mid frame": frame(token("c"))[:25], "malformed frame": b"zz\r\nnot a frame\r\n",
             "bad size line": b"-5\r\nhello\r\n", "no CRLF after a frame": b"5\r\nhelloXX"}[tail]
    result, metrics = await run_script(relay, frame(token("b")), piece, abort=True)
    assert result.status == 200 and not result.done
    assert texts(result) == TOKENS + ["b"]
    assert result.error is not None and result.error["code"] == "upstream_stream_error"
    if tail in ("malformed frame", "bad size line", "no CRLF after a frame"):
        assert "malformed body" in result.error["message"], result.error
    assert 'status="stream_error"' in metrics


@pytest.mark.hostile("a replica stalls while the native pump holds the stream: the idle-chunk watchdog ends it with a 504 "
                     "error event")
async def test_a_stall_under_the_pump_meets_the_idle_chunk_timeout(relay: str) -> None:
    result, _ = await run_script(relay, frame(token("b")), idle_chunk_timeout_s=0.6)
    assert result.status == 200 and not result.done
    assert texts(result) == TOKENS + ["b"]
    assert result.error is not None and result.error["code"] == "idle_chunk_timeout"


@pytest.mark.hostile("a replica sends bytes after the end of its body while the native pump holds the stream: the answer "
                     "ends at the body's end and the connection is not reused")
async def test_bytes_after_the_body_are_not_passed_on(relay: str) -> None:
    result, _ = await run_script(relay, END + b"HTTP/1.1 200 OK\r\nsmuggled: yes\r\n\r\n")
    assert result.status == 200 and result.done and result.error is None
    assert texts(result) == TOKENS


def test_relay_choices_are_checked() -> None:
    with pytest.raises(UserError, match=r"^--relay must be one of auto, native, python, got 'rust'$"):
        GatewayConfig(replicas=["http://127.0.0.1:1"], relay="rust").validate()


def test_native_is_refused_where_it_was_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_pump, "_native_relay", None)
    with pytest.raises(UserError, match="--relay native: the native relay was not built in this install"):
        GatewayConfig(replicas=["http://127.0.0.1:1"], relay="native").validate()
    GatewayConfig(replicas=["http://127.0.0.1:1"], relay="auto").validate()  # auto falls back to Python
