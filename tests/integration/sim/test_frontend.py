"""The sim engine's frontend stage over HTTP: preprocessing before the scheduler, the mm cache, vLLM's metrics.

Timings are read from the engine's own /metrics histograms (what vLLM would report), with a
preprocessing cost large enough (300 ms per image) that machine noise cannot blur the difference.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from tests.helpers.sim import SimHandle, start_sim_engine

MODEL = "frontend-vlm"
PREPROCESS_S = 0.3


@pytest.fixture(scope="module")
def engine() -> Iterator[SimHandle]:
    with start_sim_engine(model=MODEL, profile="tiny-cpu", output_len="fixed:2", preprocess_ms_per_image=PREPROCESS_S * 1000,
                          preprocess_ms_per_megapixel=0) as handle:
        yield handle


def _png(colour: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _ask(engine: SimHandle, *urls: str) -> None:
    parts = [{"type": "text", "text": "What is in the picture?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    response = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 2})
    assert response.status_code == 200, response.text


def _value(text: str, series: str) -> float:
    """A sample's value: `series` is the name plus its label block, as /metrics prints it."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match, f"{series} not in /metrics"
    return float(match.group(1))


def _labels() -> str:
    return f'{{engine="0",model_name="{MODEL}"}}'


def _figures(engine: SimHandle) -> dict[str, float]:
    text = engine.metrics_text()
    labels = _labels()
    return {
        "ttft": _value(text, f"vllm:time_to_first_token_seconds_sum{labels}"),
        "queue": _value(text, f"vllm:request_queue_time_seconds_sum{labels}"),
        "prefill": _value(text, f"vllm:request_prefill_time_seconds_sum{labels}"),
        "prefill_count": _value(text, f"vllm:request_prefill_time_seconds_count{labels}"),
        "queries": _value(text, f"vllm:mm_cache_queries_total{labels}"),
        "hits": _value(text, f"vllm:mm_cache_hits_total{labels}"),
    }


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def test_repeated_image_skips_preprocessing_and_counts_a_cache_hit(engine: SimHandle) -> None:
    image = _png((10, 200, 30))
    start = _figures(engine)
    _ask(engine, image)
    fresh = _delta(start, after_fresh := _figures(engine))
    _ask(engine, image)
    repeat = _delta(after_fresh, _figures(engine))
    assert fresh["ttft"] >= PREPROCESS_S  # the engine's TTFT counts from arrival: preprocessing included
    assert repeat["ttft"] < PREPROCESS_S / 2
    assert fresh["ttft"] - repeat["ttft"] > PREPROCESS_S * 0.8
    assert fresh["queue"] < 0.05  # queue time is scheduler waiting only
    assert (fresh["queries"], fresh["hits"]) == (1, 0)
    assert (repeat["queries"], repeat["hits"]) == (1, 1)
    assert fresh["prefill_count"] == 1 and 0 < fresh["prefill"] < PREPROCESS_S


def test_counters_count_items_with_vllms_names_and_types(engine: SimHandle) -> None:
    seen, new = _png((1, 2, 3)), _png((4, 5, 6))
    _ask(engine, seen)
    before = _figures(engine)
    _ask(engine, seen, new)
    delta = _delta(before, _figures(engine))
    assert (delta["queries"], delta["hits"]) == (2, 1)
    text = engine.metrics_text()
    assert "# TYPE vllm:mm_cache_queries_total counter" in text or "# TYPE vllm:mm_cache_queries counter" in text
    assert "# TYPE vllm:request_prefill_time_seconds histogram" in text
    assert f'vllm:request_prefill_time_seconds_bucket{{engine="0",le="0.3",model_name="{MODEL}"}}' in text


def test_a_burst_of_image_requests_queues_in_the_frontend_not_the_scheduler(engine: SimHandle) -> None:
    """Four new images at once, one API server at 300 ms each: TTFTs of about 0.3, 0.6, 0.9, 1.2 s."""
    images = [_png((50 + index, 60, 70)) for index in range(4)]
    before = _figures(engine)
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda url: _ask(engine, url), images))
    delta = _delta(before, _figures(engine))
    assert delta["ttft"] >= PREPROCESS_S * (1 + 2 + 3 + 4) * 0.95
    assert delta["queue"] < 0.1  # the GPU side is idle: nothing waits in the scheduler
    state = httpx.get(f"{engine.base_url}/debug/state").json()
    assert state["frontend"]["api_server_count"] == 1 and state["frontend"]["mm_cache_hits"] >= 2


def test_text_requests_pay_no_preprocessing(engine: SimHandle) -> None:
    before = _figures(engine)
    response = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert response.status_code == 200
    delta = _delta(before, _figures(engine))
    assert delta["ttft"] < PREPROCESS_S / 2 and delta["queries"] == 0
