"""The sim engine's LoRA adapters: listed as vLLM lists them, served, reported in vllm:lora_requests_info, and its
adapter slots make TTFT grow when more adapters are hot than it has slots (as vLLM's do)."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import aiohttp
import httpx

from tests.helpers.gateway_fixtures import chat_body, post_chat
from tests.helpers.sim import start_sim_engine

ADAPTERS = [f"lora-{index}" for index in range(8)]


async def ttft_p50(base_url: str, hot: list[str], requests: int = 48, users: int = 8) -> float:
    """Closed loop of `users`, each request naming the next hot adapter in turn."""
    ttfts: list[float] = []
    queue = list(range(requests))

    async def user(session: aiohttp.ClientSession) -> None:
        while queue:
            index = queue.pop()
            result = await post_chat(session, base_url, chat_body(f"request {index}", max_tokens=16, model=hot[index % len(hot)]))
            assert result.status == 200 and result.ttft_s is not None
            ttfts.append(result.ttft_s)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(user(session) for _ in range(users)))
    return statistics.median(ttfts)


async def test_adapters_are_served_listed_and_their_slots_shape_ttft(tmp_path: Path) -> None:
    with start_sim_engine(
        model="sim-model", profile="tiny-cpu", max_loras=2, lora_step_ms=2, log_dir=tmp_path, lora_module=ADAPTERS
    ) as engine:
        listed = httpx.get(f"{engine.base_url}/v1/models", timeout=10).json()["data"]
        parents = {entry["id"]: entry["parent"] for entry in listed}
        assert parents == {"sim-model": None, **{name: "sim-model" for name in ADAPTERS}}
        within = await ttft_p50(engine.base_url, ADAPTERS[:2])  # as many hot adapters as slots
        beyond = await ttft_p50(engine.base_url, ADAPTERS)  # four times as many: requests wait for a slot
        assert beyond > 1.5 * within, (within, beyond)
        metrics = httpx.get(f"{engine.base_url}/metrics", timeout=10).text
        assert 'vllm:lora_requests_info{max_lora="2"' in metrics
        unknown = httpx.post(
            f"{engine.base_url}/v1/chat/completions", timeout=10, json=chat_body("x", stream=False, model="lora-99")
        )
        assert unknown.status_code == 404
