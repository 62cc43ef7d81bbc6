"""Fresh prompts by default, explicit reuse, and the prefix-cache check, against a sim engine with prefix caching.

The figures asserted are the engine's prefix-cache hit rates and the warnings they raise,
never speeds: latency on a shared machine is not a test's business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.helpers.bench_fixtures import SIM_MODEL, bench_args
from tests.helpers.sim import SimHandle, start_sim_engine
from vlmserve.bench import runner
from vlmserve.bench.prefix_cache import expected_hit_rate, prefix_cache_block, prefix_cache_warnings
from vlmserve.bench.runner import Target, run_load
from vlmserve.bench.workloads import Conversation, Turn, fresh_variant
from vlmserve.results.blocks import ServerBlock
from vlmserve.spec import LoadSpec


@pytest.fixture(scope="module")
def cached_sim() -> Iterator[SimHandle]:
    """A scheduler-profile sim engine: block-granular KV with prefix caching on (as vLLM's default)."""
    with start_sim_engine(model=SIM_MODEL, profile="h100-qwen3vl-4b", seed=1) as handle:
        yield handle


def run(handle: SimHandle, **load):
    return asyncio.run(run_load(LoadSpec(**load), Target(handle.base_url, SIM_MODEL), progress=False))


def test_duration_run_gets_fresh_prompts_past_its_prepared_set(cached_sim, monkeypatch):
    # only 8 prompts are prepared, so the run sends each of them many times over: every repeat
    # must reach the engine as a prompt its cache has not seen
    monkeypatch.setattr(runner, "DURATION_POOL_MAX", 8)
    result = run(cached_sim, input_len=512, output_len=16, concurrency=4, duration_s=3, seed=101)
    summary = result.summary.to_dict()
    assert len(result.records) > 16
    assert len({record.conversation_id for record in result.records}) == len(result.records)
    cache = summary["prefix_cache"]
    assert cache["measured_hit_rate"] is not None and cache["measured_hit_rate"] < 0.05
    assert cache["expected_hit_rate"] == 0.0 and cache["verdict"] == "as intended"
    assert summary["warnings"] == []
    # reshuffled words keep the requested length exactly (the server's usage says so)
    assert summary["tokens"]["actual_prompt_mean"] == 512 and summary["tokens"]["prompt_length_mismatches"] == 0


def test_prompt_pool_is_explicit_reuse_and_matches_its_expected_hit_rate(cached_sim):
    result = run(cached_sim, input_len=256, output_len=4, concurrency=4, num_requests=40, prompt_pool_size=4, seed=202)
    assert len({record.conversation_id for record in result.records}) == 4
    cache = result.summary.to_dict()["prefix_cache"]
    assert cache["workload"] == "a pool of 4 prompts"
    assert cache["expected_hit_rate"] == pytest.approx(0.9)
    assert cache["measured_hit_rate"] > 0.75 and cache["verdict"] == "as intended"
    assert result.summary.to_dict()["warnings"] == []


def test_shared_prefix_is_served_from_the_cache_as_intended(cached_sim):
    result = run(cached_sim, input_len=512, output_len=4, concurrency=1, num_requests=8, shared_prefix_len=256, seed=303)
    cache = result.summary.to_dict()["prefix_cache"]
    assert cache["expected_hit_rate"] == pytest.approx(7 / 8 * 0.5)
    assert cache["verdict"] == "as intended", cache
    assert result.summary.to_dict()["tokens"]["actual_prompt_mean"] == 512


def test_prompts_cached_by_an_earlier_run_are_flagged_everywhere(cached_sim, cli, tmp_path):
    # the same seed draws the same prompts: the second run finds them in the engine's cache
    run(cached_sim, input_len=256, output_len=4, concurrency=2, num_requests=8, seed=404)
    out = tmp_path / "run.json"
    result = cli(
        *bench_args(
            cached_sim,
            "--input-len",
            256,
            "--output-len",
            4,
            "--concurrency",
            2,
            "--num-requests",
            8,
            "--seed",
            404,
            "--json-out",
            out,
        )
    )
    assert result.code == 0, result.err
    import json

    summary = json.loads(out.read_text())
    assert summary["prefix_cache"]["verdict"] == "above"
    assert summary["warnings"] and summary["warnings"][0].startswith("prefix-cache hit rate")
    assert "above the 0% this workload intends (fresh prompts)" in summary["warnings"][0]
    assert "warning: prefix-cache hit rate" in result.out
    assert summary["meta"]["simulated"] is True


def test_expected_hit_rate_follows_the_workload():
    fresh = LoadSpec(concurrency=4, num_requests=10, input_len=512)
    assert expected_hit_rate(fresh, 100) == 0.0
    prefix = fresh.model_copy(update={"shared_prefix_len": 128})
    assert expected_hit_rate(prefix, 100) == pytest.approx(0.25 * 99 / 100)
    pool = fresh.model_copy(update={"prompt_pool_size": 10})
    assert expected_hit_rate(pool, 100) == pytest.approx(0.9)
    images = LoadSpec(concurrency=4, num_requests=10, dataset="images")
    assert expected_hit_rate(images, 100) is None  # images are cached by content: no estimate


def test_mismatch_in_either_direction_is_one_warning_and_unknown_is_none():
    load = LoadSpec(concurrency=4, num_requests=10, input_len=512, prompt_pool_size=10)
    server = ServerBlock(available=True, prefix_cache_hit_rate=0.0)
    block = prefix_cache_block(load, server, 100)
    assert block.verdict == "below"
    assert "below the 90% this workload intends (a pool of 10 prompts)" in prefix_cache_warnings(block)[0]
    unknown = prefix_cache_block(load, ServerBlock(available=False), 100)
    assert unknown.verdict == "unknown" and prefix_cache_warnings(unknown) == []


def test_fresh_variant_is_deterministic_keeps_words_and_shared_prefix():
    words = [f"w{index}" for index in range(40)]
    conversation = Conversation("random-0", "random", [Turn(" ".join(words), 8, shared_words=10)])
    first, again = fresh_variant(conversation, 7, 1), fresh_variant(conversation, 7, 1)
    other = fresh_variant(conversation, 7, 2)
    assert first.turns[0].content == again.turns[0].content != other.turns[0].content
    assert first.conversation_id == "random-0~1"
    shuffled = str(first.turns[0].content).split(" ")
    assert shuffled[:10] == words[:10] and sorted(shuffled) == sorted(words)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input-len", 64, "--shared-prefix-len", 64], "error: bench: --shared-prefix-len 64 must be below --input-len 64"),
        (["--prompt-pool-size", 0], "--prompt-pool-size"),
    ],
)
def test_bad_reuse_options_are_one_line(cli, extra, message):
    result = cli("bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--concurrency", 1, "--num-requests", 1, *extra)
    assert result.code != 0
    assert message in result.error_line, result.err
