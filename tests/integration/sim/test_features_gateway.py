"""The vlmserve gateway passes the feature fields through unchanged: reasoning deltas, tool-call
deltas, logprobs, n>1 choices and usage details, streamed and not.

The same request (same seed) is sent to the engine directly and through the gateway; every
event must be equal but for the response id and creation time (the engine numbers requests).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.helpers.gateway_fixtures import running_gateway
from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "sim-gw-features"
TOOL = {"type": "function", "function": {"name": "measure", "parameters": {
    "type": "object", "properties": {"mm": {"type": "number", "minimum": 1}, "side": {"enum": ["left", "right"]}},
    "required": ["mm", "side"]}}}  # fmt: skip
REQUESTS: list[dict[str, Any]] = [
    {"chat_template_kwargs": {"enable_thinking": True}, "logprobs": True, "top_logprobs": 2, "n": 2,
     "stream_options": {"include_usage": True}},
    {"tools": [TOOL], "tool_choice": "required", "logprobs": True},
    {"response_format": {"type": "json_object"}, "n": 2},
]  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> Iterator[SimHandle]:
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=1, seed=3, output_len="fixed:6") as handle:
        yield handle


def _normalized(payload: Any) -> Any:
    if isinstance(payload, dict):
        return {k: v for k, v in payload.items() if k not in ("id", "created")}
    return payload


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        raw = await response.read()
    if not body.get("stream"):
        return response.status, [_normalized(json.loads(raw))]
    events = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else _normalized(json.loads(data)))
    return response.status, events


@pytest.mark.parametrize("stream", [True, False])
async def test_gateway_passes_feature_fields_through(engine: SimHandle, stream: bool) -> None:
    async with running_gateway([engine]) as gateway, aiohttp.ClientSession() as session:
        for seed, extra in enumerate(REQUESTS):
            if not stream:
                extra = {k: v for k, v in extra.items() if k != "stream_options"}
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Measure the lesion."}], "seed": seed,
                    "stream": stream, **extra}  # fmt: skip
            direct_status, direct = await _post(session, engine.base_url, body)
            via_status, via = await _post(session, gateway.base_url, body)
            assert direct_status == via_status == 200
            assert via == direct
            text = json.dumps(direct)
            if "chat_template_kwargs" in extra:
                assert '"reasoning"' in text and '"reasoning_content"' in text and '"reasoning_tokens"' in text
            if "tools" in extra:
                assert '"tool_calls"' in text and '"arguments"' in text
            if extra.get("logprobs"):
                assert '"top_logprobs"' in text
