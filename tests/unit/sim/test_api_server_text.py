"""vLLM's API server pricing text too (sched.frontend): per-request, per-prompt-token and per-output-token
CPU on `api_server_count` servers, in front of the real scheduler on the virtual clock."""

from __future__ import annotations

import pytest

from vlmserve.sched.frontend import Frontend, FrontendConfig
from vlmserve.sched.parametric_cost import get_profile
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest
from vlmserve.sched.virtual_clock import RequestTiming, Send, run_virtual_clock

REQUESTS = 200
PROMPT, OUTPUT = 128, 4


def _burst(count: int = REQUESTS) -> list[Send]:
    """`count` short requests sent at once (GPUStack's random 128 in / 4 out shape)."""
    return [Send(0.0, index, SimRequest(f"r{index}", list(range(index << 20, (index << 20) + PROMPT)), OUTPUT))
            for index in range(count)]


def _run(frontend: FrontendConfig | None) -> dict[str, RequestTiming]:
    timings, _stats = run_virtual_clock([Scheduler(SchedulerConfig(), get_profile("h100-8b"))], _burst(),
                                        frontend=frontend)
    return timings


def _request_rate(timings: dict[str, RequestTiming]) -> float:
    return len(timings) / max(timing.finished_s or 0.0 for timing in timings.values())


def test_text_costs_queue_on_the_servers_prompt_tokens_included() -> None:
    frontend = Frontend(FrontendConfig(api_server_count=1, per_request_ms=2.0, per_prompt_token_ms=0.01))
    first = frontend.admit(0.0, [], prompt_tokens=100)
    second = frontend.admit(0.0, [], prompt_tokens=100)
    assert first.ready_s == pytest.approx(0.003) and second.start_s == pytest.approx(0.003)
    assert second.ready_s == pytest.approx(0.006)
    assert frontend.emit(0.001, 10) == 0.001  # no per-output cost: delivered at once, nothing held
    streaming = Frontend(FrontendConfig(per_request_ms=1.0, per_output_token_ms=0.5))
    assert streaming.emit(1.0, 4) == pytest.approx(1.002)
    behind = streaming.admit(1.0, [], prompt_tokens=8)  # waits behind the stream on the one server
    assert (behind.start_s, behind.ready_s) == (pytest.approx(1.002), pytest.approx(1.003))


def test_the_api_server_bounds_request_throughput_when_its_cost_times_rate_exceeds_the_servers() -> None:
    """Unbounded, the engine finishes this burst above 100 req/s; at 40 ms of CPU a request one
    server caps it at 25 req/s and two at 50 req/s (plus the output tokens' share)."""
    engine_rate = _request_rate(_run(None))
    assert engine_rate > 100
    one = _request_rate(_run(FrontendConfig(api_server_count=1, per_request_ms=40.0)))
    two = _request_rate(_run(FrontendConfig(api_server_count=2, per_request_ms=40.0)))
    assert one == pytest.approx(25.0, rel=0.05)
    assert two == pytest.approx(50.0, rel=0.05)
    streamed = _request_rate(_run(FrontendConfig(api_server_count=1, per_request_ms=40.0, per_output_token_ms=10.0)))
    assert streamed == pytest.approx(1000.0 / (40.0 + OUTPUT * 10.0), rel=0.05)  # output work shares the CPU


def test_zero_costs_reproduce_the_run_without_a_frontend_exactly() -> None:
    plain = _run(None)
    zero = _run(FrontendConfig(api_server_count=1))
    assert {key: (t.first_token_s, t.finished_s, t.token_times_s) for key, t in zero.items()} == \
           {key: (t.first_token_s, t.finished_s, t.token_times_s) for key, t in plain.items()}


@pytest.mark.hostile("negative or NaN API-server text costs")
@pytest.mark.parametrize(("config", "problem"), [
    (FrontendConfig(per_request_ms=-1.0), "api-server per-request ms must not be negative, got -1"),
    (FrontendConfig(per_output_token_ms=float("nan")),
     "api-server per-output-token ms must be a finite number of milliseconds, got nan"),
])
def test_bad_text_costs_are_refused_in_one_line(config: FrontendConfig, problem: str) -> None:
    assert config.validate() == [problem]
