"""Load behaviour through a real engine process: the knee, preemptions and prefix-cache hits in /metrics.

Latencies are read from the engine's own /metrics (vLLM's histograms), so a slow client on
a shared machine does not blur them; the assertions compare load levels with wide margins.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import httpx

from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "load-model"


def _metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        match = re.match(r"^[^{]+\{([^}]*)\} (\S+)$", line)
        if not match:
            continue
        sample_labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(sample_labels.get(key) == value for key, value in labels.items()):
            total += float(match.group(2))
    return total


async def _closed_loop(base_url: str, concurrency: int, duration_s: float, body: dict) -> int:
    """`concurrency` workers send requests back to back for `duration_s`; returns requests done."""
    done = 0
    deadline = time.monotonic() + duration_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def _level(engine: SimHandle, concurrency: int, duration_s: float, body: dict) -> dict[str, float]:
    before = engine.metrics_text()
    started = time.monotonic()
    asyncio.run(_closed_loop(engine.base_url, concurrency, duration_s, body))
    elapsed = time.monotonic() - started
    after = engine.metrics_text()

    def delta(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    return {
        "concurrency": concurrency,
        "ttft_mean_s": delta("vllm:time_to_first_token_seconds_sum") / delta("vllm:time_to_first_token_seconds_count"),
        "queue_mean_s": delta("vllm:request_queue_time_seconds_sum") / delta("vllm:request_queue_time_seconds_count"),
        "tokens_per_s": delta("vllm:generation_tokens_total") / elapsed,
    }


def test_knee_through_the_server() -> None:
    """Closed-loop load at rising concurrency against a profile with 16 seats: TTFT and queueing
    rise, throughput climbs, then levels off at the profile's capacity."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Summarise the findings in two lines please."}],
        "max_tokens": 8,
        "ignore_eos": True,
    }
    with start_sim_engine(model=MODEL, profile="a10g-8b", max_num_seqs=16, seed=1) as engine:
        rows = [_level(engine, concurrency, 1.5, body) for concurrency in (1, 4, 16, 48)]
    ttft = [row["ttft_mean_s"] for row in rows]
    queue = [row["queue_mean_s"] for row in rows]
    throughput = [row["tokens_per_s"] for row in rows]
    assert ttft[-1] > 3 * ttft[0], rows
    assert queue[0] < 0.01 and queue[-1] > 0.2, rows
    assert throughput[2] > 4 * throughput[0], rows
    assert throughput[3] < 1.35 * throughput[2], rows  # levelled off: 3x the load, not 3x the tokens


def test_too_small_kv_cache_preempts_and_it_shows_in_metrics() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": " ".join(["context"] * 150)}],
        "max_tokens": 150,
        "ignore_eos": True,
    }
    with start_sim_engine(model=MODEL, profile="tiny-cpu", num_kv_blocks=64, max_model_len=1024) as engine:
        asyncio.run(_closed_loop(engine.base_url, 8, 0.5, body))
        metrics = engine.metrics_text()
    assert _metric(metrics, "vllm:num_preemptions_total", model_name=MODEL, engine="0") > 0
    assert _metric(metrics, "vllm:request_success_total", finished_reason="length") >= 8


def test_prefix_cache_hits_for_a_repeated_prefix_and_for_a_multi_turn_answer() -> None:
    shared = "You are a dental radiograph assistant. " + " ".join(f"rule{index}" for index in range(300))
    with start_sim_engine(model=MODEL, profile="tiny-cpu") as engine:
        url = f"{engine.base_url}/v1/chat/completions"

        def ask(question: str) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": shared + " " + question}], "max_tokens": 2}
            assert httpx.post(url, json=body, timeout=30).status_code == 200

        ask("first question")
        first = engine.metrics_text()
        assert _metric(first, "vllm:prefix_cache_hits_total") == 0
        queries_once = _metric(first, "vllm:prefix_cache_queries_total")
        for question in ("second question", "third question", "fourth question"):
            ask(question)
        after = engine.metrics_text()
        hits = _metric(after, "vllm:prefix_cache_hits_total")
        queries = _metric(after, "vllm:prefix_cache_queries_total")
        assert hits >= 3 * (queries_once - 32)  # every later request reuses all full blocks of the shared part
        assert hits / queries > 0.6

        # Generated text re-tokenizes to the generated ids, so turn 2 hits prompt *and* answer blocks.
        turn_one = [{"role": "user", "content": "Describe the image in detail."}]
        first_turn = httpx.post(url, json={"model": MODEL, "messages": turn_one, "max_tokens": 200, "ignore_eos": True}).json()
        answer = first_turn["choices"][0]["message"]["content"]
        before = _metric(engine.metrics_text(), "vllm:prefix_cache_hits_total")
        turn_two = [*turn_one, {"role": "assistant", "content": answer}, {"role": "user", "content": "And the left side?"}]
        second_turn = httpx.post(url, json={"model": MODEL, "messages": turn_two, "max_tokens": 2}).json()
        turn_hits = _metric(engine.metrics_text(), "vllm:prefix_cache_hits_total") - before
    reusable = first_turn["usage"]["total_tokens"] - 1  # prompt + answer, less the token still being generated
    assert second_turn["usage"]["prompt_tokens"] > reusable
    assert turn_hits >= (reusable // 16) * 16 - 16, (turn_hits, reusable)
