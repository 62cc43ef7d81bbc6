"""Client-chosen ids against a real gateway (a sim engine): the gateway's own id keys every count;
the client's X-Request-ID is recorded and echoed only, bounded and checked; X-Session-ID pins hold
bounded memory (request_info.py, routing/session.py). The X-Request-ID values refused with a 400 are
tested on the wire in test_http1_server.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import chat_body, post_chat, running_gateway, sim_engines
from tests.helpers.sim import SimHandle


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    with sim_engines(1, tmp_path_factory.mktemp("ids"), ttft_ms=20, itl_ms=2) as handles:
        yield handles[0]


@pytest.mark.hostile("clients reuse one X-Request-ID for concurrent requests: the routing counts stay exact")
async def test_colliding_client_request_ids_leave_no_phantom_load(engine: SimHandle) -> None:
    async with running_gateway([engine], policy="least-outstanding-tokens") as gw, aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *[
                post_chat(session, gw.base_url, chat_body("same id", max_tokens=30), headers={"X-Request-ID": "dup-1"})
                for _ in range(8)
            ]
        )
        assert [r.status for r in results] == [200] * 8
        outstanding = gw.gateway._outstanding_tokens()
        assert outstanding is not None and set(outstanding.values()) == {0}, outstanding
        gateway_ids = {r.headers["X-Request-ID"] for r in results}
        assert len(gateway_ids) == 8 and "dup-1" not in gateway_ids
        assert {r.headers["X-Client-Request-ID"] for r in results} == {"dup-1"}


async def test_the_audit_line_keeps_the_gateway_id_and_the_clients_apart(engine: SimHandle, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    async with running_gateway([engine], audit_log=audit) as gw, aiohttp.ClientSession() as session:
        mine = await post_chat(session, gw.base_url, chat_body("x", stream=False), headers={"X-Request-ID": "order-17"})
        plain = await post_chat(session, gw.base_url, chat_body("y", stream=False))
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["client_request_id"] for r in records] == ["order-17", None]
    assert [r["id"] for r in records] == [mine.headers["X-Request-ID"], plain.headers["X-Request-ID"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", r["id"]) for r in records)
    assert mine.headers["X-Client-Request-ID"] == "order-17" and "X-Client-Request-ID" not in plain.headers


@pytest.mark.hostile("thousands of long X-Session-ID values: each pin holds a bounded key")
async def test_long_session_ids_pin_under_a_bounded_key(engine: SimHandle) -> None:
    async with running_gateway([engine]) as gw, aiohttp.ClientSession() as session:
        long_ids = [f"{n:04d}" + "s" * 6000 for n in range(40)]
        for session_id in long_ids + long_ids[:1]:
            result = await post_chat(
                session, gw.base_url, chat_body("pin", max_tokens=1, stream=False), headers={"X-Session-ID": session_id}
            )
            assert result.status == 200
        pins = gw.gateway.policy._sessions  # type: ignore[attr-defined]
        assert len(pins) == 40 and max(len(key) for key in pins) <= 64
