"""The run-level breakdown from vLLM's histograms: deltas of sum and count give each part's mean."""

from __future__ import annotations

import pytest

from vlmserve.bench.engine_breakdown import engine_breakdown
from vlmserve.bench.scrape import ServerScraper, parse_samples

LABELS = '{engine="0",model_name="m"}'


def exposition(
    ttft: tuple[float, int], queue: tuple[float, int], prefill: tuple[float, int], mm: tuple[int, int] = (0, 0)
) -> str:
    """A /metrics page as vLLM writes it (histogram buckets included, which the scraper skips)."""
    lines = [
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for name, (total, count) in (("time_to_first_token", ttft), ("request_queue_time", queue), ("request_prefill_time", prefill)):
        lines += [
            f'vllm:{name}_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {count}',
            f"vllm:{name}_seconds_sum{LABELS} {total}",
            f"vllm:{name}_seconds_count{LABELS} {count}",
        ]
    lines += [f"vllm:mm_cache_queries_total{LABELS} {mm[0]}", f"vllm:mm_cache_hits_total{LABELS} {mm[1]}"]
    return "\n".join(lines) + "\n"


def test_means_come_from_the_deltas_and_the_frontend_is_the_rest_of_ttft() -> None:
    before = parse_samples(exposition((1.0, 10), (0.2, 10), (0.5, 10)))
    after = parse_samples(exposition((3.0, 30), (0.6, 30), (1.5, 30)))
    block = engine_breakdown(before, after)
    assert block is not None
    assert block.ttft_ms == pytest.approx(100.0) and block.requests == 20
    assert block.queue_ms == pytest.approx(20.0) and block.prefill_ms == pytest.approx(50.0)
    assert block.frontend_ms == pytest.approx(30.0)


def test_no_histograms_or_no_requests_gives_no_breakdown() -> None:
    assert engine_breakdown({}, {}) is None
    same = parse_samples(exposition((1.0, 10), (0.2, 10), (0.5, 10)))
    assert engine_breakdown(same, same) is None


def test_the_server_block_carries_the_breakdown_and_the_multimodal_cache_hit_rate() -> None:
    scraper = ServerScraper("http://x")
    scraper.before = parse_samples(exposition((1.0, 10), (0.2, 10), (0.5, 10), mm=(10, 2)))
    scraper.after = parse_samples(exposition((3.0, 30), (0.6, 30), (1.5, 30), mm=(30, 12)))
    server = scraper.summary()
    assert server.mm_cache_hit_rate == pytest.approx(0.5)
    assert server.engine_breakdown is not None and server.engine_breakdown.frontend_ms == pytest.approx(30.0)
