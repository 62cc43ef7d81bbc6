"""The over-saturation stop: a collapsing open loop ends early and says so; a healthy one runs to the end."""

from __future__ import annotations

import asyncio

from tests.helpers.sim import start_sim_engine
from vlmserve.bench.runner import Target, run_load
from vlmserve.bench.saturation import OversaturationDetector, SaturationRule
from vlmserve.results.records import RequestRecord
from vlmserve.spec import LoadSpec


def finished(ttft_s: float, at_wall: float) -> RequestRecord:
    record = RequestRecord(request_id="r", scheduled_at_s=at_wall - ttft_s, sent_at_s=at_wall - ttft_s)
    record.first_token_at_s, record.finished_at_s, record.ok = at_wall, at_wall, True
    return record


def test_rule_needs_a_growing_backlog_and_growing_ttft() -> None:
    rule = SaturationRule(window_s=1.0, growing_windows=3, min_backlog=4)
    # 10 sends a second; the server finishes 2 a second, each waiting longer than the last
    growing = OversaturationDetector(rule, [index / 10 for index in range(100)], started_perf=0.0)
    verdicts = []
    for second in range(1, 6):
        for done in range(2):
            growing.observe(finished(0.1 * second**2, at_wall=second - 0.5 + done * 0.1))
        verdicts.append(growing.close_window(now_perf=float(second), now_wall=float(second)))
    assert verdicts[:3] == [None, None, None] and verdicts[-1] is not None
    assert "requests waiting grew" in verdicts[-1] and "past saturation" in verdicts[-1]
    # the same backlog with a flat TTFT (a slow but steady server) is not oversaturated
    steady = OversaturationDetector(rule, [index / 10 for index in range(100)], started_perf=0.0)
    for second in range(1, 6):
        for done in range(2):
            steady.observe(finished(0.05, at_wall=second - 0.5 + done * 0.1))
        assert steady.close_window(now_perf=float(second), now_wall=float(second)) is None


def test_open_loop_past_saturation_stops_early_and_says_so() -> None:
    with start_sim_engine(model="m", profile="h100-qwen3vl-4b", max_num_seqs=1, seed=2) as engine:
        target = Target(engine.base_url, "m")

        def run(rate: float, stop: bool | None) -> dict:
            load = LoadSpec(
                rate=rate, arrival="constant", duration_s=3.0, input_len=32, output_len=64, stop_when_oversaturated=stop
            )
            return asyncio.run(run_load(load, target, progress=False)).summary.to_dict()

        collapsing = run(20.0, True)
        assert collapsing["meta"]["stopped"] == "oversaturated"
        assert "past saturation" in collapsing["meta"]["stopped_reason"]
        assert collapsing["meta"]["interrupted"] is False
        assert collapsing["requests"]["total"] < 20 * 3  # sending ended before the 3 s were up
        healthy = run(1.0, True)
        assert healthy["meta"]["stopped"] is None and healthy["requests"]["failed"] == 0


def test_only_open_loops_that_ask_are_judged() -> None:
    from vlmserve.bench.load import WorkerPlan, WorkItem
    from vlmserve.bench.runner import oversaturation_detector
    from vlmserve.bench.workloads import Conversation

    plan = WorkerPlan(index=0, url="u", headers={}, options=None, items=[WorkItem(Conversation("c", "w", []), [], 0.0)])  # type: ignore[arg-type]
    open_loop = dict(rate=5.0, num_requests=10)
    assert oversaturation_detector(LoadSpec(**open_loop, stop_when_oversaturated=True), [plan]) is not None
    assert oversaturation_detector(LoadSpec(**open_loop), [plan]) is None  # bench's default: off
    closed = LoadSpec(concurrency=4, num_requests=10, stop_when_oversaturated=True)
    assert oversaturation_detector(closed, [plan]) is None  # a closed loop's queue is bounded by its users
