"""Reading an engine's progress from its metrics, and judging a stall only when it is busy and still."""

from __future__ import annotations

from vlmserve.deploy.progress import EngineProgress, StallJudge, parse_progress

PAGE = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:generation_tokens_total{engine="0",model_name="m"} 23.0
vllm:num_requests_waiting_by_reason{reason="x"} 9.0
"""


def test_the_reading_sums_label_sets_and_ignores_other_lines() -> None:
    assert parse_progress(PAGE) == EngineProgress(waiting=3.0, running=1.0, tokens=123.0)
    assert parse_progress("vllm:num_requests_waiting 4\n") is None  # no token counters: nothing to judge
    assert parse_progress("vllm:generation_tokens_total NaN\nvllm:prompt_tokens_total 5\n") == EngineProgress(0, 0, 5)


def test_a_stall_is_judged_only_when_busy_and_still_for_the_whole_window() -> None:
    judge = StallJudge(window_s=10.0)
    idle = EngineProgress(waiting=0, running=0, tokens=50)
    busy = EngineProgress(waiting=1, running=0, tokens=50)
    assert all(judge.observe(idle, now) is None for now in range(0, 100, 5))  # idle and still: fine
    assert judge.observe(busy, 100) is None and judge.observe(busy, 109) is None
    verdict = judge.observe(busy, 110)
    assert verdict == "stalled: 1 waiting and 0 running, no prompt or generation token in 10 s while /health answers"
    judge.reset()
    moving = [EngineProgress(waiting=5, running=2, tokens=50 + step) for step in range(20)]
    assert all(judge.observe(reading, 200 + 5 * step) is None for step, reading in enumerate(moving))
