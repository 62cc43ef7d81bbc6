"""The one interface every simulated scheduler offers (after vLLM's `SchedulerInterface`).

Two schedulers implement it: `Scheduler` (vLLM V1's rules, each step priced by a StepCostModel)
and `ConstantLatencyScheduler` (fixed TTFT and ITL). The sim engine's real-time loop and the
virtual-clock loop that `plan` and offline simulation share drive either through this protocol
alone, so a new scheduler model plugs into both without touching them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vlmserve.sched.scheduler import SimRequest, StepResult


@runtime_checkable
class EngineCore(Protocol):
    """Requests in, steps out; times are seconds on whatever clock the caller drives."""

    num_preemptions_total: int

    def add_request(self, request: SimRequest) -> None:
        """Queue a request; ValueError if no engine could run it (too long, duplicate id)."""

    def abort_request(self, request_id: str) -> None:
        """Drop a request wherever it is; unknown ids are ignored."""

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""

    def next_event_s(self, now_s: float) -> float | None:
        """When the next step should start (`now_s` when it can start at once; None when idle)."""

    def step(self, now_s: float) -> StepResult:
        """Run one step starting at `now_s` and say what it did."""

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...
