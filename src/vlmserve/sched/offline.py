"""Run the scheduler model on a virtual clock: arrivals in, per-request timings out.

No sleeping and no sockets: the clock jumps from step end to step end (or to the
next arrival when the engine is idle), so an hour of traffic simulates in seconds.
The planner builds on this; the sim engine runs the same Scheduler in real time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vlmserve.results.records import RequestRecord
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest, StepResult
from vlmserve.sched.step_cost import StepCostModel


@dataclass
class SimulatedRequestTiming:
    """When things happened to one request in the simulation (seconds, virtual clock)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    cached_prompt_tokens: int = 0
    images: int = 0

    @property
    def queue_time_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    def to_request_record(self, requested_output_tokens: int | None = None) -> RequestRecord:
        """The same record a measured run produces, marked simulated."""
        return RequestRecord(
            request_id=self.request_id,
            scheduled_at_s=self.arrival_s,
            sent_at_s=self.arrival_s,
            first_token_at_s=self.first_token_s,
            finished_at_s=self.finished_s,
            chunk_times_s=list(self.token_times_s),
            chunk_tokens=[1] * len(self.token_times_s),
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            requested_prompt_tokens=self.prompt_tokens,
            requested_output_tokens=requested_output_tokens,
            image_count=self.images,
            ok=self.finished_s is not None,
            simulated=True,
        )


@dataclass
class SimulationStats:
    """Engine-level totals of one simulation (what /metrics counters would show)."""

    steps: int = 0
    busy_s: float = 0.0
    num_preemptions: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    max_num_running: int = 0
    max_num_waiting: int = 0
    max_kv_usage: float = 0.0


def simulate(
    requests: Iterable[SimRequest],
    config: SchedulerConfig,
    cost: StepCostModel,
    *,
    record_token_times: bool = True,
    stats: SimulationStats | None = None,
) -> list[SimulatedRequestTiming]:
    """Simulate `requests` (any order; sorted by arrival) and return one timing per request.

    `record_token_times=False` skips the per-token time lists (saves memory on long runs).
    Pass a `SimulationStats` to collect engine totals alongside.
    """
    ordered = sorted(requests, key=lambda request: request.arrival_s)
    scheduler = Scheduler(config, cost)
    timings: dict[str, SimulatedRequestTiming] = {}
    for request in ordered:
        if request.request_id in timings:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        timings[request.request_id] = SimulatedRequestTiming(
            request_id=request.request_id,
            arrival_s=request.arrival_s,
            prompt_tokens=len(request.prompt_token_ids),
            images=request.images,
        )
    totals = stats if stats is not None else SimulationStats()
    now_s = ordered[0].arrival_s if ordered else 0.0
    next_index = 0
    while next_index < len(ordered) or scheduler.has_work():
        while next_index < len(ordered) and ordered[next_index].arrival_s <= now_s:
            scheduler.add_request(ordered[next_index])
            next_index += 1
        if not scheduler.has_work():
            now_s = ordered[next_index].arrival_s
            continue
        result = scheduler.step(now_s)
        _apply_step(result, timings, record_token_times)
        accumulate_stats(totals, result)
        now_s = result.end_s
    return [timings[request.request_id] for request in ordered]


def _apply_step(
    result: StepResult,
    timings: dict[str, SimulatedRequestTiming],
    record_token_times: bool,
) -> None:
    end_s = result.end_s
    for request_id, cached_tokens in result.first_scheduled:
        timing = timings[request_id]
        timing.first_scheduled_s = result.start_s
        timing.cached_prompt_tokens = cached_tokens
    for request_id, count in result.tokens:
        timing = timings[request_id]
        timing.output_tokens += count
        if record_token_times:
            timing.token_times_s.append(end_s)
    for request_id in result.first_token:
        timings[request_id].first_token_s = end_s
    for request_id in result.preempted:
        timings[request_id].num_preemptions += 1
    for request_id in result.finished:
        timings[request_id].finished_s = end_s


def accumulate_stats(totals: SimulationStats, result: StepResult) -> None:
    """Add one step to the engine totals (also used by the planner's multi-replica driver)."""
    totals.steps += 1
    totals.busy_s += result.duration_s
    totals.num_preemptions += len(result.preempted)
    totals.prefix_queries_tokens += result.prefix_queries_tokens
    totals.prefix_hits_tokens += result.prefix_hits_tokens
    totals.max_num_running = max(totals.max_num_running, result.num_running)
    totals.max_num_waiting = max(totals.max_num_waiting, result.num_waiting)
    totals.max_kv_usage = max(totals.max_kv_usage, result.kv_usage)
