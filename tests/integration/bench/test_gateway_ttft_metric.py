"""A bench run through the gateway: the gateway's TTFT histogram counts generation only, so it reads
as the engine's plus the gateway's own time (the bench's /tokenize calls, answered in about a
millisecond, used to pull it far below the engine's)."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.bench_fixtures import SIM_MODEL
from tests.helpers.gateway_proc import start_gateway

GATEWAY_TTFT = "vlmserve_gateway_time_to_first_token_seconds"
GATEWAY_E2E = "vlmserve_gateway_e2e_request_latency_seconds"
ENGINE_TTFT = "vllm:time_to_first_token_seconds"


def _histogram_sums(url: str, name: str) -> dict[tuple[tuple[str, str], ...], tuple[float, float]]:
    """(sum, count) of each series of histogram `name` at `url`, keyed by its labels."""
    series: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        if family.name != name:
            continue
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            if sample.name.endswith("_sum"):
                series.setdefault(labels, [0.0, 0.0])[0] = sample.value
            elif sample.name.endswith("_count"):
                series.setdefault(labels, [0.0, 0.0])[1] = sample.value
    return {labels: (total, count) for labels, (total, count) in series.items()}


def test_the_gateways_ttft_is_the_engines_plus_its_own_time_after_a_bench(cli, sim, tmp_path: Path) -> None:
    engine_before = (
        sum(total for total, _ in _histogram_sums(f"{sim.base_url}/metrics", ENGINE_TTFT).values()),
        sum(count for _, count in _histogram_sums(f"{sim.base_url}/metrics", ENGINE_TTFT).values()),
    )
    with start_gateway([sim.base_url], tmp_path) as gateway:
        # no local tokenizer for the sim's model: the bench counts tokens with /tokenize, through the gateway
        result = cli(
            "bench",
            "--base-url",
            gateway.base_url,
            "--model",
            SIM_MODEL,
            "--no-progress",
            "--no-store",
            "--num-requests",
            "24",
            "--rate",
            "8",
            "--output-len",
            "16",
        )
        assert result.code == 0, result.err
        ttft = _histogram_sums(f"{gateway.base_url}/metrics", GATEWAY_TTFT)
        e2e = _histogram_sums(f"{gateway.base_url}/metrics", GATEWAY_E2E)
    routes_timed = {dict(labels)["route"] for labels in e2e}
    assert "/tokenize" in routes_timed, routes_timed  # the bench's token counts did go through the gateway
    assert {dict(labels)["route"] for labels in ttft} == {"/v1/chat/completions"}
    gateway_sum, gateway_count = (sum(values) for values in zip(*ttft.values()))
    engine = _histogram_sums(f"{sim.base_url}/metrics", ENGINE_TTFT)
    engine_sum = sum(total for total, _ in engine.values()) - engine_before[0]
    engine_count = sum(count for _, count in engine.values()) - engine_before[1]
    assert gateway_count == engine_count >= 24  # the runs, and any probe the bench sends first
    gateway_mean, engine_mean = gateway_sum / gateway_count, engine_sum / engine_count
    # the gateway's TTFT holds the engine's and what the gateway adds (a few ms at this load, at most)
    assert engine_mean <= gateway_mean <= engine_mean + 0.010, (gateway_mean, engine_mean)
