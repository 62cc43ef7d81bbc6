"""`plan search` tries vLLM --api-server-count values: a frontend-bound load needs API servers, not GPUs."""

from __future__ import annotations

from vlmserve.hardware.calibration import default_calibration
from vlmserve.plan.search import SearchSpace, run_search
from vlmserve.spec import SLO, LoadSpec


def test_search_finds_more_api_servers_before_another_gpu() -> None:
    space = SearchSpace(
        model="qwen3-vl-4b", gpus=["h100"], tps=[1], replicas=[1, 2], max_num_seqs=[256], api_server_counts=[1, 2]
    )
    load = LoadSpec(dataset="images", input_len=64, output_len=32, rate=70.0, num_requests=300, image_size=(512, 512))
    outcome = run_search(space, load, SLO.parse("ttft_p95=500ms"), prices={}, calibration=default_calibration())
    assert outcome.best is not None
    assert (outcome.best.replicas, outcome.best.api_server_count) == (1, 2), outcome.best.label
    assert outcome.best.label.endswith("api-server-count 2")
    single = next(c for c in outcome.candidates if (c.replicas, c.api_server_count) == (1, 1))
    assert single.status == "misses" and "frontend-bound" in single.reason


def test_one_api_server_is_the_default_and_wins_ties() -> None:
    """A text load is not frontend-bound: with 1 and 4 API servers both meeting the SLO, 1 ranks first."""
    space = SearchSpace(model="llama-3.1-8b", gpus=["h100"], tps=[1], replicas=[1], max_num_seqs=[256], api_server_counts=[4, 1])
    load = LoadSpec(input_len=256, output_len=32, rate=2.0, num_requests=40)
    outcome = run_search(space, load, SLO.parse("ttft_p95=2s"), prices={}, calibration=default_calibration())
    assert outcome.best is not None and outcome.best.api_server_count == 1
    other = next(c for c in outcome.candidates if c.api_server_count == 4)
    assert other.status == "meets" and "more API server" in other.reason
    assert SearchSpace(model="m", gpus=["h100"]).api_server_counts == [1]
