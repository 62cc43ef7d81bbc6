"""A short bench against the real embedded vLLM engine (shared session fixture)."""

from __future__ import annotations

import asyncio

import pytest

from vlmserve.bench.runner import Target, run_load
from vlmserve.spec import SLO, LoadSpec


@pytest.mark.engine
def test_bench_against_embedded_vllm(embedded_engine):
    target = Target(embedded_engine.base_url, embedded_engine.model)
    load = LoadSpec(
        api="completions",
        concurrency=2,
        num_requests=6,
        warmup=1,
        input_len=64,
        output_len=12,
        tokenizer=embedded_engine.model_path,
    )
    result = asyncio.run(run_load(load, target, slo=SLO.parse("ttft_p99=30s"), progress=False))
    summary = result.summary.to_dict()
    assert summary["requests"]["completed"] == 6, summary["requests"]
    tokens = summary["tokens"]
    # the model's own tokenizer fits prompts exactly; ignore_eos gives exact output lengths
    assert tokens["actual_prompt_mean"] == 64 and tokens["prompt_length_mismatches"] == 0
    assert tokens["actual_output_mean"] == 12 and tokens["output_length_mismatches"] == 0
    assert tokens["tokenizer_checked"] == 6
    assert summary["meta"]["per_chunk_usage"] is True and summary["meta"]["server_version"]
    counted = [record for record in result.records if not record.warmup]
    # per-chunk usage: the chunks' token counts add up to usage; ITL has one value per token after the first chunk
    assert all(sum(record.chunk_tokens) == record.output_tokens for record in counted)
    assert summary["itl_ms"]["count"] == sum(record.output_tokens - record.chunk_tokens[0] for record in counted)
    assert summary["tpot_ms"]["p50"] > 0
    server = summary["server"]
    assert server["available"] is True
    assert server["counters"]["generation_tokens"] >= 6 * 12
    assert server["counters"]["prefix_cache_queries"] > 0
    assert summary["goodput"]["fraction"] == 1.0

    # a vision request through the real image processor: image tokens come back in usage
    images = LoadSpec(dataset="images", concurrency=1, num_requests=2, input_len=16, output_len=4, image_size=(64, 64))
    vision = asyncio.run(run_load(images, target, progress=False)).summary.to_dict()
    assert vision["requests"]["completed"] == 2, vision["requests"]
    assert vision["tokens"]["actual_prompt_mean"] > 16
