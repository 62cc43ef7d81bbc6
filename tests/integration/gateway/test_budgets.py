"""Token budgets that cannot be walked past: the real gateway, a sim engine, a real redis-server.

A budget charges what a request may cost (its prompt estimate plus max_tokens, capped by the
model's context) and settles to what it did cost, never refunding more than it charged. The two
ways past it found in review were both refunds: of the estimate beyond the charge (a request
asking for max_tokens=8000 against a 1,000 tokens/min budget was charged 1,000 and refunded
~7,800), and of the prompt of a stream that reported no usage (settled to its chunks alone).
A third was a count: a stream without usage was settled from the blocks the gateway read, and a
fast engine or a slow client merges many SSE events into one block (200-token answers counted
as 22-32 tokens), so most of the output's charge was refunded. It is now settled from its events.
Each scenario runs with the budget in this process and through Redis (`--state`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import MODEL, chat_body, post_chat, running_gateway, sim_engines
from tests.helpers.redis_server import RedisServer
from tests.helpers.sim import SimHandle
from vlmserve.gateway.server import RunningGateway

BUDGET_PER_MIN = 1000
ANSWER_TOKENS = 200  # every answer of the engine below ends after this many tokens
KEY = {"Authorization": "Bearer sk-budget"}
FREE_KEY = {"Authorization": "Bearer sk-free"}  # a tenant with no budget, for the engine's own counts


@pytest.fixture(scope="module")
def short_answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """One engine whose answers all end after ANSWER_TOKENS tokens, quickly (0.2 ms a token)."""
    with sim_engines(
        1, tmp_path_factory.mktemp("budget-sims"), ttft_ms=1, itl_ms=0.2, output_len=f"fixed:{ANSWER_TOKENS}"
    ) as handles:
        yield handles[0]


@asynccontextmanager
async def budget_gateway(
    engine: SimHandle, tmp_path: Path, where: str, redis_server: RedisServer | None, **settings: object
) -> AsyncIterator[RunningGateway]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f"tenants:\n  - name: metered\n    keys: [sk-budget]\n    tokens_per_min: {BUDGET_PER_MIN}\n"
        "  - name: free\n    keys: [sk-free]\n"
    )
    state = {"state": redis_server.url, "state_unavailable": "closed"} if where == "redis" else {}
    async with running_gateway([engine], keys_file=keys, **state, **settings) as gateway:
        async with aiohttp.ClientSession() as session:  # the replica's model list is in before the first request
            for _ in range(100):
                async with session.get(gateway.base_url + "/v1/models", headers=KEY) as response:
                    if response.status == 200 and (await response.json())["data"]:
                        break
                await asyncio.sleep(0.05)
        yield gateway


@pytest.fixture(params=["local", "redis"])
def where(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def maybe_redis(where: str, request: pytest.FixtureRequest) -> RedisServer | None:
    return request.getfixturevalue("redis_server") if where == "redis" else None


def assert_within_budget(costs: list[int], elapsed_s: float) -> None:
    """What was admitted costs no more than the budget, its refill while the test ran, and one request."""
    allowed = BUDGET_PER_MIN + elapsed_s * BUDGET_PER_MIN / 60 + max(costs, default=0)
    assert sum(costs) <= allowed, f"admitted {len(costs)} requests costing {sum(costs)} tokens, allowed {allowed:.0f}"


@pytest.mark.hostile("max_tokens far over a tokens/min budget, to be refunded at settle (12 of 12 got through)")
async def test_a_large_max_tokens_is_charged_not_refunded_past_its_charge(
    short_answers: SimHandle, tmp_path: Path, where: str, maybe_redis: RedisServer | None
) -> None:
    async with budget_gateway(short_answers, tmp_path, where, maybe_redis) as gateway, aiohttp.ClientSession() as session:
        started = time.monotonic()
        costs: list[int] = []
        refused = []
        for i in range(12):
            result = await post_chat(
                session, gateway.base_url, chat_body(f"q{i}", max_tokens=8000, stream=False, ignore_eos=False), KEY
            )
            if result.status == 200:
                usage = result.body["usage"]
                assert usage["completion_tokens"] == ANSWER_TOKENS
                costs.append(usage["prompt_tokens"] + usage["completion_tokens"])
            else:
                refused.append(result)
        elapsed_s = time.monotonic() - started
    assert costs, "the first request, with the budget full, is admitted (and charged all it may cost)"
    assert all(
        r.status == 429 and r.body["error"]["code"] == "rate_limit_exceeded" and "'metered'" in r.body["error"]["message"]
        for r in refused
    ), [r.body for r in refused]
    assert_within_budget(costs, elapsed_s)


@pytest.mark.hostile("streams without include_usage, so the settle refunded the prompt (12 of 12 got through)")
async def test_a_stream_without_usage_is_settled_with_the_gateways_prompt_estimate(
    short_answers: SimHandle, tmp_path: Path, where: str, maybe_redis: RedisServer | None
) -> None:
    prompt = "word " * 1692  # 8,460 characters: about 2,115 tokens at the gateway's 4 characters a token
    async with budget_gateway(short_answers, tmp_path, where, maybe_redis) as gateway, aiohttp.ClientSession() as session:
        started = time.monotonic()
        admitted = 0
        for i in range(12):
            body = {"model": MODEL, "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": f"{i} {prompt}"}]}
            result = await post_chat(session, gateway.base_url, body, KEY)
            if result.status == 200:
                assert result.done and not any(e.get("usage") for e in result.events)  # the client asked for none
                admitted += 1
            else:
                assert result.status == 429 and result.body["error"]["code"] == "rate_limit_exceeded"
        elapsed_s = time.monotonic() - started
    # each admitted stream cost its prompt (~2,115 tokens, over the whole budget) and up to 20 more
    assert_within_budget([2115] * admitted, elapsed_s)
    assert admitted == 1


async def read_slowly(
    session: aiohttp.ClientSession, base_url: str, body: dict[str, object], headers: dict[str, str]
) -> tuple[int, list[dict[str, object]]]:
    """POST a stream and read it a little at a time, pausing between reads (a slow client: the
    gateway's reads of the replica then merge more events); its status and its chunks' events."""
    async with session.post(base_url + "/v1/chat/completions", json=body, headers=headers) as response:
        raw = b""
        async for piece in response.content.iter_chunked(1024):
            raw += piece
            await asyncio.sleep(0.001)
    if response.status != 200:
        return response.status, [json.loads(raw)]
    lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]", lines[-3:]
    return 200, [json.loads(line) for line in lines[:-1]]


def content_tokens(events: list[dict[str, object]]) -> int:
    """The answer's tokens as the client saw them: one content delta per token (the sim's and
    vLLM's stream_interval=1)."""
    return sum(1 for e in events for choice in e["choices"] if choice.get("delta", {}).get("content"))  # type: ignore[union-attr, attr-defined]


@pytest.mark.hostile("stream without usage: blocks merged by a fast engine or slow reader undercount the output")
async def test_a_stream_without_usage_is_settled_from_its_events_not_the_blocks_they_came_in(
    short_answers: SimHandle, tmp_path: Path, where: str, maybe_redis: RedisServer | None
) -> None:
    audit = tmp_path / "audit.jsonl"
    body = {
        "model": MODEL,
        "max_tokens": ANSWER_TOKENS,
        "stream": True,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "q00"}],
    }
    async with (
        budget_gateway(short_answers, tmp_path, where, maybe_redis, audit_log=audit) as gateway,
        aiohttp.ClientSession() as session,
    ):
        # the engine's own prompt count for this shape of request, from a tenant without a budget
        control = await post_chat(session, gateway.base_url, {**body, "stream_options": {"include_usage": True}}, FREE_KEY)
        prompt_tokens = next(e["usage"]["prompt_tokens"] for e in control.events if e.get("usage"))
        started = time.monotonic()
        costs: list[int] = []
        for i in range(12):
            status, events = await read_slowly(
                session, gateway.base_url, {**body, "messages": [{"role": "user", "content": f"q{i:02d}"}]}, KEY
            )
            if status == 200:
                assert not any(e.get("usage") for e in events)  # the client asked for none
                assert content_tokens(events) == ANSWER_TOKENS
                costs.append(prompt_tokens + ANSWER_TOKENS)
            else:
                error = events[0]["error"]
                assert status == 429 and error["code"] == "rate_limit_exceeded", error  # type: ignore[index]
        elapsed_s = time.monotonic() - started
    assert_within_budget(costs, elapsed_s)
    # what each was settled to: the role event and its 200 tokens (a block count was 22-32)
    settled = [
        r["completion_tokens"]
        for r in map(json.loads, audit.read_text().splitlines())
        if r["tenant"] == "metered" and r["status"] == "200"
    ]
    assert len(settled) == len(costs)
    assert all(ANSWER_TOKENS <= tokens <= ANSWER_TOKENS * 1.02 for tokens in settled), settled


@pytest.mark.hostile("max_tokens of 1e309, 10**309, negative, fractional or a string")
@pytest.mark.parametrize(
    "raw",
    ["1e309", "1" + "0" * 309, "-5", "0", "12.5", '"100"', "true", "-1e309"],
    ids=["1e309", "10**309", "negative", "zero", "fraction", "string", "bool", "-1e309"],
)
async def test_an_absurd_max_tokens_is_a_400_before_any_arithmetic(
    short_answers: SimHandle, tmp_path: Path, where: str, maybe_redis: RedisServer | None, raw: str
) -> None:
    body = ('{"model": "%s", "max_tokens": %s, "messages": [{"role": "user", "content": "hi"}]}' % (MODEL, raw)).encode()
    async with budget_gateway(short_answers, tmp_path, where, maybe_redis) as gateway, aiohttp.ClientSession() as session:
        result = await post_chat(session, gateway.base_url, body, KEY)
        error = result.body["error"]
        assert result.status == 400 and error["code"] == "invalid_max_tokens", result.body
        assert "'max_tokens'" in error["message"] and "whole number" in error["message"], error
        assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
        # nothing was charged, and shared state (if any) is still there for everyone
        fine = await post_chat(session, gateway.base_url, chat_body("hi", max_tokens=5, stream=False), KEY)
        assert fine.status == 200, fine.body
        health = await (await session.get(gateway.base_url + "/health")).json()
    if where == "redis":
        assert health["state"]["available"] is True, health


@pytest.mark.hostile("a keys file with a tenant rate of inf or 1e-30, given to `vlmserve gateway`")
@pytest.mark.parametrize(("key", "value"), [("tokens_per_min", ".inf"), ("requests_per_s", "1e-30")])
def test_a_keys_file_with_an_absurd_rate_stops_the_gateway_with_one_line(tmp_path: Path, key: str, value: str) -> None:
    """As an operator runs it (a process: a gateway that took the file would serve until the timeout)."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants:\n  - name: greedy\n    keys: [sk-greedy]\n    {key}: {value}\n")
    done = subprocess.run(
        [sys.executable, "-m", "vlmserve", "gateway", "--replica", "http://127.0.0.1:1", "--port", "0", "--keys-file", str(keys)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    stderr = done.stderr
    assert done.returncode == 2 and stderr.startswith("error: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert "tenant 'greedy'" in stderr and key in stderr and "must be a finite number from" in stderr
