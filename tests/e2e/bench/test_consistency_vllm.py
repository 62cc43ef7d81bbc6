"""`vlmserve consistency` on the real embedded vLLM engine: 32 temperature-0 text requests (and 8 image
requests) alone vs under 16-way load. Real vLLM may differ under batching (its CPU build is not
batch-invariant); the test asserts the report is complete and sane, not that every answer matches,
and keeps the JSON in artifacts/ (the figures in docs/benchmarks.md come from such a run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.engine
def test_consistency_on_embedded_vllm(embedded_engine, cli, artifacts_dir: Path) -> None:
    result_file = artifacts_dir / "consistency-embedded.json"
    done = cli(
        "consistency", "--base-url", embedded_engine.base_url, "--model", embedded_engine.model,
        "--num-requests", 32, "--num-image-requests", 8, "--concurrency", 16, "--output-len", 32,
        "--min-identical", 0, "--result-file", result_file,
    )  # fmt: skip
    print(done.out)
    data = json.loads(result_file.read_text())
    assert "Traceback" not in done.err
    assert data["simulated"] is False
    assert data["checked"] == data["compared"] == 40, data["problems"]  # every request answered, alone and under load
    assert data["units"] == ["token_id"]  # vLLM returns token ids (return_token_ids): compared token by token
    assert data["by_kind"]["text"]["compared"] == 32 and data["by_kind"]["image"]["compared"] == 8
    assert data["in_flight_at_send"]["min"] >= 1 and data["in_flight_at_send"]["max"] <= 15
    assert 0.0 <= data["identical_fraction"] <= 1.0
    for entry in data["differing"]:  # every difference is located
        assert entry["first_difference"] is not None and entry["unit"] == "token_id"
    # --min-identical 0: only an image swap (or a missing answer) can fail the check
    assert done.code == (0 if data["passed"] else 1)
    assert all("image swap" in problem for problem in data["problems"])
