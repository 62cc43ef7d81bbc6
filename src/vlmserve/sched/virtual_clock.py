"""The one virtual-clock loop: simulated schedulers behind a router, no sleeping, no sockets.

The clock jumps from event to event — the next send or the earliest replica step — so an hour
of traffic simulates in seconds. `plan` drives it with N replicas and open- or closed-loop load;
`simulate` (offline simulation, `benchmarks/sched_offline_speed.py`) is the one-replica,
open-loop case. Both get the same per-request timings and engine totals; `RequestTiming` turns
into the same `RequestRecord` a measured run produces, marked simulated.

Rules kept: a send at the same instant as a step is handed over first (the request can join
that step); an idle replica's clock jumps to the arrival; routing counts load as
`routing.request_load_tokens`, exactly as the gateway's least-outstanding-tokens policy does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from vlmserve.errors import UserError
from vlmserve.results.records import RequestRecord
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS, POLICY_ALIASES, ROUND_ROBIN, SIMULATED_POLICIES, request_load_tokens
from vlmserve.sched.engine_core import EngineCore
from vlmserve.sched.frontend import Frontend, FrontendConfig, only_fresh_images
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest, StepResult
from vlmserve.sched.step_cost import StepCostModel


@dataclass
class RequestTiming:
    """When things happened to one request (seconds, virtual clock)."""

    request_id: str
    sent_s: float
    arrival_s: float
    prompt_tokens: int
    max_output_tokens: int
    replica: int = 0
    images: int = 0
    output_tokens: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    cached_prompt_tokens: int = 0
    ready_s: float | None = None
    """When the frontend handed it to the scheduler (arrival_s when it has no frontend work)."""
    mm_cache_hits: int = 0

    @property
    def queue_time_s(self) -> float | None:
        """The engine's queue: from reaching the scheduler to first being scheduled (frontend excluded)."""
        if self.first_scheduled_s is None:
            return None
        return self.first_scheduled_s - (self.arrival_s if self.ready_s is None else self.ready_s)

    @property
    def frontend_s(self) -> float:
        """Time in the frontend (waiting for an API server, then preprocessing)."""
        return 0.0 if self.ready_s is None else self.ready_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    def to_request_record(
        self,
        *,
        epoch_s: float = 0.0,
        request_id: str | None = None,
        scheduled_s: float | None = None,
        requested_prompt_tokens: int | None = None,
        requested_output_tokens: int | None = None,
        workload: str | None = None,
        warmup: bool = False,
    ) -> RequestRecord:
        """The record a measured run would hold, on the wall clock `epoch_s` + virtual time."""
        finished = self.finished_s is not None
        times = [epoch_s + value for value in self.token_times_s]
        return RequestRecord(
            request_id=request_id or self.request_id,
            scheduled_at_s=epoch_s + (self.sent_s if scheduled_s is None else scheduled_s),
            sent_at_s=epoch_s + self.sent_s,
            first_token_at_s=None if self.first_token_s is None else epoch_s + self.first_token_s,
            finished_at_s=None if self.finished_s is None else epoch_s + self.finished_s,
            chunk_times_s=times,
            chunk_tokens=[1] * len(times),
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            requested_prompt_tokens=self.prompt_tokens if requested_prompt_tokens is None else requested_prompt_tokens,
            requested_output_tokens=requested_output_tokens,
            image_count=self.images,
            ok=finished,
            error_kind=None if finished else "not_finished",
            workload=workload or "",
            worker=self.replica,
            warmup=warmup,
            simulated=True,
        )


@dataclass
class SimulationStats:
    """Engine-level totals of one replica (what its /metrics counters would show)."""

    steps: int = 0
    busy_s: float = 0.0
    num_preemptions: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    max_num_running: int = 0
    max_num_waiting: int = 0
    max_kv_usage: float = 0.0
    mm_cache_queries: int = 0
    mm_cache_hits: int = 0
    frontend_busy_s: float = 0.0
    images_encoded: int = 0
    """Images the vision encoder ran (multimodal-cache and prefix-cache hits skip it)."""
    image_tokens_encoded: int = 0

    def add_step(self, result: StepResult) -> None:
        self.steps += 1
        self.images_encoded += result.contents.images
        self.image_tokens_encoded += result.contents.image_tokens
        self.busy_s += result.duration_s
        self.num_preemptions += len(result.preempted)
        self.prefix_queries_tokens += result.prefix_queries_tokens
        self.prefix_hits_tokens += result.prefix_hits_tokens
        self.max_num_running = max(self.max_num_running, result.num_running)
        self.max_num_waiting = max(self.max_num_waiting, result.num_waiting)
        self.max_kv_usage = max(self.max_kv_usage, result.kv_usage)


@dataclass
class ReplicaClock:
    """One simulated replica: its scheduler, its own clock, the load routed to it."""

    core: EngineCore
    clock_s: float = 0.0
    outstanding_tokens: int = 0
    in_flight: int = 0
    stats: SimulationStats = field(default_factory=SimulationStats)
    frontend: Frontend | None = None


class SimulatedRouter:
    """Round-robin or least-outstanding-tokens, with the gateway's meaning and tie-break."""

    def __init__(self, policy: str, replicas: Sequence[ReplicaClock]) -> None:
        policy = POLICY_ALIASES.get(policy, policy)
        if policy not in SIMULATED_POLICIES:
            raise UserError(f"--routing '{policy}' is not known; use one of: {', '.join(SIMULATED_POLICIES)}")
        self.policy = policy
        self.replicas = replicas
        self._rotation = -1

    def choose(self) -> int:
        """The replica index for the next request (rotation breaks ties, as in the gateway)."""
        self._rotation += 1
        count = len(self.replicas)
        if self.policy == ROUND_ROBIN:
            return self._rotation % count
        assert self.policy == LEAST_OUTSTANDING_TOKENS
        order = [(self._rotation + offset) % count for offset in range(count)]
        return min(order, key=lambda index: (self.replicas[index].outstanding_tokens, self.replicas[index].in_flight))


@dataclass(order=True)
class Send:
    """A request leaving its client at `send_s`; it reaches the engine at `request.arrival_s`."""

    send_s: float
    sequence: int
    request: SimRequest = field(compare=False)


NextSend = Callable[[float], "Send | None"]
"""Closed loop: called with the finish time of a request, returns the client's next send (or None)."""


@dataclass(order=True)
class _Arrival:
    """A request leaving the frontend for its replica's scheduler at `ready_s`."""

    ready_s: float
    sequence: int
    replica: int = field(compare=False)
    request: SimRequest = field(compare=False)


def run_virtual_clock(
    cores: Sequence[EngineCore],
    sends: Iterable[Send],
    *,
    routing: str = ROUND_ROBIN,
    next_send: NextSend | None = None,
    record_token_times: bool = True,
    frontend: FrontendConfig | None = None,
) -> tuple[dict[str, RequestTiming], list[SimulationStats]]:
    """Run every send to completion on `cores`; return timings by request id and per-replica totals.

    With `frontend`, each replica has its own API servers and multimodal cache (sched.frontend):
    a request with images reaches its replica's scheduler when its preprocessing is done, and
    only its images not in the cache are encoded.
    """
    replicas = [ReplicaClock(core, frontend=Frontend(frontend) if frontend else None) for core in cores]
    router = SimulatedRouter(routing, replicas)
    pending = list(sends)
    heapq.heapify(pending)
    arriving: list[_Arrival] = []
    timings: dict[str, RequestTiming] = {}
    while True:
        busy = [replica for replica in replicas if replica.core.has_work()]
        next_step = min(busy, key=lambda replica: _next_step_s(replica)) if busy else None
        step_s = _next_step_s(next_step) if next_step is not None else None
        if (
            pending
            and (step_s is None or pending[0].send_s <= step_s)
            and (not arriving or pending[0].send_s <= arriving[0].ready_s)
        ):
            send = heapq.heappop(pending)
            arrival = _hand_over(send, replicas, router, timings)
            if arrival is not None:
                heapq.heappush(arriving, arrival)
            continue
        if arriving and (step_s is None or arriving[0].ready_s <= step_s):
            arrival = heapq.heappop(arriving)
            _enter_scheduler(replicas[arrival.replica], arrival.request)
            continue
        if next_step is None:
            break
        result = next_step.core.step(_next_step_s(next_step))
        next_step.clock_s = result.end_s
        next_step.stats.add_step(result)
        for request_id in _apply_step(result, timings, record_token_times):
            timing = timings[request_id]
            replica = replicas[timing.replica]
            replica.outstanding_tokens -= request_load_tokens(timing.prompt_tokens, timing.max_output_tokens)
            replica.in_flight -= 1
            follow_up = next_send(result.end_s) if next_send is not None else None
            if follow_up is not None:
                heapq.heappush(pending, follow_up)
    return timings, [replica.stats for replica in replicas]


def _next_step_s(replica: ReplicaClock) -> float:
    due = replica.core.next_event_s(replica.clock_s)
    return replica.clock_s if due is None else max(replica.clock_s, due)


def _hand_over(
    send: Send, replicas: list[ReplicaClock], router: SimulatedRouter, timings: dict[str, RequestTiming]
) -> _Arrival | None:
    """Route a send; it enters its replica's scheduler now, or later (returned) after the frontend."""
    request = send.request
    if request.request_id in timings:
        raise ValueError(f"duplicate request id {request.request_id!r}")
    index = router.choose()
    replica = replicas[index]
    replica.outstanding_tokens += request_load_tokens(len(request.prompt_token_ids), request.max_output_tokens)
    replica.in_flight += 1
    timing = timings[request.request_id] = RequestTiming(
        request_id=request.request_id,
        sent_s=send.send_s,
        arrival_s=request.arrival_s,
        prompt_tokens=len(request.prompt_token_ids),
        max_output_tokens=request.max_output_tokens,
        replica=index,
        images=request.images,
    )
    if replica.frontend is not None and request.image_items:
        visit = replica.frontend.admit(request.arrival_s, request.image_items)
        replica.stats.mm_cache_queries += visit.queries
        replica.stats.mm_cache_hits += visit.hits
        replica.stats.frontend_busy_s = replica.frontend.busy_s
        timing.ready_s, timing.mm_cache_hits = visit.ready_s, visit.hits
        arrived_s = request.arrival_s
        request = replace(only_fresh_images(request, visit.fresh), arrival_s=visit.ready_s)
        if visit.ready_s > arrived_s:
            return _Arrival(visit.ready_s, send.sequence, index, request)
    if request.arrival_s > send.send_s:
        # Time outside the engine (HTTP, tokenisation): the request reaches the scheduler at its
        # arrival, also while the engine is busy with others (else only an idle engine honoured it).
        return _Arrival(request.arrival_s, send.sequence, index, request)
    _enter_scheduler(replica, request)
    return None


def _enter_scheduler(replica: ReplicaClock, request: SimRequest) -> None:
    if not replica.core.has_work():
        replica.clock_s = max(replica.clock_s, request.arrival_s)
    replica.core.add_request(request)


def _apply_step(result: StepResult, timings: dict[str, RequestTiming], record_token_times: bool) -> list[str]:
    """Write one step's events into the timings; return the ids that finished."""
    end_s = result.end_s
    for request_id, cached_tokens in result.first_scheduled:
        timing = timings[request_id]
        timing.first_scheduled_s = result.start_s
        timing.cached_prompt_tokens = cached_tokens
    for request_id, count in result.tokens:
        timing = timings[request_id]
        timing.output_tokens += count
        if timing.first_token_s is None:
            timing.first_token_s = end_s
        if record_token_times:
            timing.token_times_s.append(end_s)
    for request_id in result.preempted:
        timings[request_id].num_preemptions += 1
    for request_id in result.finished:
        timings[request_id].finished_s = end_s
    return list(result.finished)


def simulate(
    requests: Iterable[SimRequest],
    config: SchedulerConfig,
    cost: StepCostModel,
    *,
    record_token_times: bool = True,
    stats: SimulationStats | None = None,
) -> list[RequestTiming]:
    """One replica, open loop: each request arrives at its own `arrival_s`; timings in arrival order.

    `record_token_times=False` skips per-token time lists (saves memory on long runs); pass a
    `SimulationStats` to collect the engine totals alongside.
    """
    ordered = sorted(requests, key=lambda request: request.arrival_s)
    sends = [Send(request.arrival_s, index, request) for index, request in enumerate(ordered)]
    seen: set[str] = set()
    for request in ordered:
        if request.request_id in seen:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        seen.add(request.request_id)
    timings, totals = run_virtual_clock([Scheduler(config, cost)], sends, record_token_times=record_token_times)
    if stats is not None:
        for name, value in vars(totals[0]).items():
            setattr(stats, name, value)
    return [timings[request.request_id] for request in ordered]
