"""Small parts of the sim engine: tokenizer, answer planning, timing recorder, ITL histogram."""

from __future__ import annotations

import random

import pytest

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.generation import plan_output
from vlmserve.engines.sim.metrics import BatchedHistogram, EngineMetrics
from vlmserve.engines.sim.options import OutputLengthDistribution
from vlmserve.engines.sim.protocol import ParsedRequest
from vlmserve.engines.sim.timing import EmissionTimingRecorder
from vlmserve.errors import UserError


def _request(**fields: object) -> ParsedRequest:
    defaults: dict = {"kind": "chat", "model": "m", "prompt_token_ids": [1, 2, 3], "max_tokens": 50}
    return ParsedRequest(**{**defaults, **fields})


def test_tokenizer_is_deterministic_and_about_word_sized() -> None:
    text = "The radiograph shows a periapical lesion near tooth 36, about 4 mm wide."
    assert tokenizer.encode(text) == tokenizer.encode(text)
    assert 14 <= len(tokenizer.encode(text)) <= 22


def test_generated_text_retokenizes_to_the_generated_ids() -> None:
    plan = plan_output(_request(max_tokens=300, ignore_eos=True), OutputLengthDistribution("fixed", 10), random.Random(1))
    assert tokenizer.encode(plan.text) == list(plan.token_ids)


def test_plans_are_deterministic_and_lengths_follow_the_rules() -> None:
    dist = OutputLengthDistribution("fixed", 20)
    assert plan_output(_request(), dist, random.Random(3)).text == plan_output(_request(), dist, random.Random(3)).text
    natural = plan_output(_request(), dist, random.Random(3))
    assert natural.num_tokens == 20 and natural.finish_reason == "stop"
    capped = plan_output(_request(max_tokens=5), dist, random.Random(3))
    assert capped.num_tokens == 5 and capped.finish_reason == "length"
    padded = plan_output(_request(min_tokens=30), dist, random.Random(3))
    assert padded.num_tokens == 30


def test_stop_string_is_cut_and_not_returned() -> None:
    plan = plan_output(
        _request(max_tokens=2000, ignore_eos=True, stop=[","]), OutputLengthDistribution("fixed", 1), random.Random(5)
    )
    assert plan.finish_reason == "stop" and plan.stop_reason == ","
    assert "," not in plan.text and plan.num_tokens < 2000
    multi = plan_output(
        _request(max_tokens=2000, ignore_eos=True, stop=[" ka", ","]), OutputLengthDistribution("fixed", 1), random.Random(5)
    )
    assert multi.num_tokens <= plan.num_tokens


def test_output_length_distributions_parse_and_sample() -> None:
    rng = random.Random(0)
    assert OutputLengthDistribution.parse("fixed:7").sample(rng) == 7
    assert 10 <= OutputLengthDistribution.parse("uniform:10:20").sample(rng) <= 20
    samples = [OutputLengthDistribution.parse("lognormal:200:0.8").sample(rng) for _ in range(4000)]
    assert 180 < sum(samples) / len(samples) < 220
    with pytest.raises(UserError, match="not understood"):
        OutputLengthDistribution.parse("normal:5")


def test_timing_recorder_quantiles_are_bin_upper_edges() -> None:
    recorder = EmissionTimingRecorder()
    for index in range(100):
        recorder.record(index * 1e-4)  # 0.0 .. 9.9 ms
    summary = recorder.summary()
    assert summary["chunks"] == 100 and summary["max_ms"] == pytest.approx(9.9)
    assert 4.9 <= summary["p50_ms"] <= 5.02 and 9.8 <= summary["p99_ms"] <= 9.92
    recorder.record(0.5)  # beyond the range: clamped into the last bin, max still exact
    assert recorder.summary()["max_ms"] == 500.0


def test_batched_histogram_matches_prometheus_bucket_semantics() -> None:
    histogram = BatchedHistogram("x_seconds", "doc", [0.1, 0.5], ["m", "0"])
    histogram.observe_many([0.1, 0.2, 0.7])
    family = next(iter(histogram.collect()))
    buckets = {sample.labels["le"]: sample.value for sample in family.samples if sample.name.endswith("_bucket")}
    assert buckets == {"0.1": 1, "0.5": 2, "+Inf": 3}  # le is inclusive, as in Prometheus


def test_two_engines_in_one_process_have_separate_registries() -> None:
    first, second = EngineMetrics("a"), EngineMetrics("b")
    first.generation_tokens.inc(5)
    assert b'model_name="a"' in first.render() and b'model_name="a"' not in second.render()
