"""The image reuse workload against a sim engine: the engine's cache hit rate matches the stated repeat rate,
and figures come per request type, repeats apart from first sightings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.sim import start_sim_engine
from vlmserve.results.summary import RunSummary


@pytest.mark.parametrize("repeat_rate", [0.3, 0.6])
def test_reported_cache_hit_rate_matches_the_stated_repeat_rate(cli, tmp_path: Path, repeat_rate: float) -> None:
    out = tmp_path / "run.json"
    with start_sim_engine(model="m", profile="tiny-cpu", mm_preprocess_ms_per_image=20) as engine:
        result = cli(
            "bench",
            "--base-url",
            engine.base_url,
            "--model",
            "m",
            "--no-progress",
            "--dataset",
            "images",
            "--image-repeat-rate",
            repeat_rate,
            "--image-size",
            "32x32",
            "--num-requests",
            80,
            "--concurrency",
            4,
            "--input-len",
            8,
            "--output-len",
            4,
            "--seed",
            5,
            "--json-out",
            out,
        )
    assert result.code == 0, result.err
    summary = RunSummary.model_validate(json.loads(out.read_text()))
    assert summary.server is not None
    hit_rate = summary.server.mm_cache_hit_rate
    assert abs(hit_rate - repeat_rate) <= 0.10, (hit_rate, repeat_rate)
    assert f"repeat rate {repeat_rate:.2f} stated" in result.err + result.out
    first, repeat = summary.figure("by_type.image.first.requests"), summary.figure("by_type.image.repeat.requests")
    assert first + repeat == 80 and abs(repeat / 80 - hit_rate) <= 0.02  # one image per request: a repeat is a hit
