"""The one virtual-clock loop: both schedulers behind the EngineCore protocol, routing by tokens."""

from __future__ import annotations

from vlmserve.sched.constant import ConstantLatencyScheduler
from vlmserve.sched.engine_core import EngineCore
from vlmserve.sched.parametric_cost import get_profile
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import Send, run_virtual_clock


def _request(request_id: str, prompt: int, output: int, at: float = 0.0) -> SimRequest:
    return SimRequest(request_id, list(range(prompt)), output, arrival_s=at)


def test_both_schedulers_are_engine_cores() -> None:
    assert isinstance(Scheduler(SchedulerConfig(), get_profile("h100-8b")), EngineCore)
    assert isinstance(ConstantLatencyScheduler(ttft_s=0.05, itl_s=0.01), EngineCore)


def test_constant_latency_runs_on_the_virtual_clock() -> None:
    """TTFT and ITL come out exactly as configured: the loop jumps to each token's due time."""
    sends = [Send(0.0, 0, _request("a", 10, 5)), Send(1.0, 1, _request("b", 10, 3, at=1.0))]
    timings, stats = run_virtual_clock([ConstantLatencyScheduler(ttft_s=0.05, itl_s=0.01)], sends)
    a, b = timings["a"], timings["b"]
    assert abs(a.ttft_s - 0.05) < 1e-3 and a.output_tokens == 5
    assert abs(a.e2e_s - (0.05 + 4 * 0.01)) < 2e-3
    assert abs(b.ttft_s - 0.05) < 1e-3 and b.output_tokens == 3
    assert stats[0].steps >= 8


def test_least_outstanding_counts_tokens_like_the_gateway() -> None:
    """One long request on replica 0 outweighs two short ones: the next goes where fewer tokens wait."""
    cores = [Scheduler(SchedulerConfig(), get_profile("h100-8b")) for _ in range(2)]
    sends = [
        Send(0.0, 0, _request("long", 4000, 500)),
        Send(0.0, 1, _request("short-1", 10, 10)),
        Send(0.0, 2, _request("short-2", 10, 10)),
        Send(0.0, 3, _request("short-3", 10, 10)),
    ]
    timings, _ = run_virtual_clock(cores, sends, routing="least-outstanding-tokens")
    assert timings["long"].replica == 0
    assert {timings[name].replica for name in ("short-1", "short-2", "short-3")} == {1}


def test_closed_loop_sends_the_next_request_when_one_finishes() -> None:
    core = Scheduler(SchedulerConfig(), get_profile("h100-8b"))
    queue = [_request(f"r{i}", 20, 4) for i in range(1, 4)]

    def next_send(finished_s: float) -> Send | None:
        if not queue:
            return None
        request = queue.pop(0)
        request.arrival_s = finished_s
        return Send(finished_s, 10, request)

    timings, _ = run_virtual_clock([core], [Send(0.0, 0, _request("r0", 20, 4))], next_send=next_send)
    order = sorted(timings.values(), key=lambda timing: timing.sent_s)
    assert [timing.request_id for timing in order] == ["r0", "r1", "r2", "r3"]
    for earlier, later in zip(order, order[1:]):
        assert later.sent_s == earlier.finished_s
