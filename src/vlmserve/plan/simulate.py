"""Simulated runs: the shared vLLM scheduler model, priced by the roofline, on a virtual clock.

N replicas (each its own `Scheduler` and clock) sit behind a routing policy; requests
arrive open loop (at the load's rate) or closed loop (a new one when one finishes, at the
load's concurrency). The clock jumps from event to event, so thousands of requests
simulate in well under a second. The output is what `vlmserve bench` produces — one
`RequestRecord` per request (marked simulated) and a `RunResult` whose summary comes
from the bench's own `metrics.summarize` — so `report` and `compare` work on it.
"""

from __future__ import annotations

import heapq
import time
import uuid
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any

from vlmserve.results.metrics import summarize
from vlmserve.results.run import RunResult
from vlmserve.errors import UserError
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.workload import PlannedRequest, planned_requests
from vlmserve.results.records import RequestRecord
from vlmserve.sched.offline import SimulationStats, accumulate_stats
from vlmserve.sched.scheduler import Scheduler, SimRequest
from vlmserve.sched.step_cost import StepContents
from vlmserve.spec import SLO, LoadSpec

ROUTING_POLICIES = ("round-robin", "least-outstanding")
TOKEN_ID_STRIDE = 1 << 24
"""Each request's prompt ids start at index·stride: distinct prompts, no false prefix hits."""


@dataclass
class _Replica:
    scheduler: Scheduler
    clock_s: float = 0.0
    outstanding: int = 0
    stats: SimulationStats = field(default_factory=SimulationStats)


@dataclass
class _Tracking:
    """Per-request timings on the virtual clock."""

    planned: PlannedRequest
    sent_s: float
    replica: int
    token_times_s: list[float] = field(default_factory=list)
    first_token_s: float | None = None
    finished_s: float | None = None
    preemptions: int = 0


class _Router:
    """Round-robin or least-outstanding-requests choice of replica."""

    def __init__(self, policy: str, replicas: list[_Replica]) -> None:
        if policy not in ROUTING_POLICIES:
            raise UserError(f"--routing '{policy}' is not known; use one of: {', '.join(ROUTING_POLICIES)}")
        self.policy = policy
        self.replicas = replicas
        self.next_index = 0

    def choose(self) -> int:
        if self.policy == "round-robin":
            index = self.next_index
            self.next_index = (self.next_index + 1) % len(self.replicas)
            return index
        return min(range(len(self.replicas)), key=lambda index: (self.replicas[index].outstanding, index))


@dataclass
class SimulationOutput:
    """The run as bench would report it, plus engine-side totals."""

    result: RunResult
    stats: list[SimulationStats]
    wall_s: float


def _sim_request(planned: PlannedRequest, arrival_s: float) -> SimRequest:
    base = planned.index * TOKEN_ID_STRIDE
    return SimRequest(
        request_id=str(planned.index),
        prompt_token_ids=list(range(base, base + planned.prompt_tokens)),
        max_output_tokens=planned.output_tokens,
        arrival_s=arrival_s,
        image_tokens=planned.image_tokens,
        images=planned.images,
    )


def _default_count(load: LoadSpec) -> int:
    if load.num_requests is not None:
        return load.num_requests
    rate_or_concurrency = load.rate if load.rate is not None else float(load.concurrency or 1)
    return max(int(rate_or_concurrency * (load.duration_s or 60.0)), 1)


def simulate_run(
    setup: PlanSetup,
    load: LoadSpec,
    *,
    slo: SLO | None = None,
    label: str | None = None,
    record_token_times: bool = True,
    staggered: bool = False,
) -> SimulationOutput:
    """Simulate `load` against `setup` and summarize it exactly as a measured run.

    Closed loop starts all `concurrency` clients at once, as `vlmserve bench` does. With
    `staggered=True` client i starts i/concurrency of an estimated request time later:
    the steady state a long closed-loop run reaches once output lengths vary, without a
    synchronized first wave of prefills (which fixed lengths would otherwise keep in lockstep).
    """
    started = time.perf_counter()
    count = _default_count(load)
    image_tokens = setup.model.vision.default_tokens_per_image if setup.model.vision else 0
    if load.dataset == "images" and setup.model.vision is None:
        raise UserError(f"{setup.model.name} has no vision tower (no vision_config); use a text dataset or a VLM")
    requests = planned_requests(load, count, image_tokens)
    longest = max(request.prompt_tokens + request.output_tokens for request in requests)
    typical = int(sum(request.prompt_tokens + request.output_tokens / 2 for request in requests) / len(requests))
    config = setup.scheduler_config(typical, longest)
    cost = setup.cost_model()
    overhead_s = setup.efficiency.request_overhead_s
    try:
        replicas = [_Replica(Scheduler(config, cost)) for _ in range(setup.replicas)]
    except ValueError as err:  # engine limits vLLM would refuse to start with
        raise UserError(f"{setup.model.name} on {setup.tp}× {setup.gpu.name}: {err}") from None
    router = _Router(setup.routing, replicas)

    # Pending sends: (time, sequence, request index). Closed loop starts `concurrency`
    # at t=0 and sends the next one when one finishes; open loop has all times up front.
    pending: list[tuple[float, int, int]] = []
    closed_loop = load.rate is None
    next_unsent = 0
    if closed_loop:
        clients = min(load.concurrency or 1, count)
        spacing = estimated_request_s(setup, requests, clients) / clients if staggered else 0.0
        for client in range(clients):
            pending.append((client * spacing, next_unsent, next_unsent))
            next_unsent += 1
    else:
        pending = [(request.arrival_s, request.index, request.index) for request in requests]
        next_unsent = count
    heapq.heapify(pending)
    tracking: dict[str, _Tracking] = {}

    while True:
        busy = [replica for replica in replicas if replica.scheduler.has_work()]
        next_step = min(busy, key=lambda replica: replica.clock_s) if busy else None
        if pending and (next_step is None or pending[0][0] <= next_step.clock_s):
            send_s, _, index = heapq.heappop(pending)
            planned = requests[index]
            arrival_s = send_s + overhead_s  # the request reaches the engine after HTTP + tokenize
            chosen = router.choose()
            replica = replicas[chosen]
            if not replica.scheduler.has_work():
                replica.clock_s = max(replica.clock_s, arrival_s)
            replica.scheduler.add_request(_sim_request(planned, arrival_s))
            replica.outstanding += 1
            tracking[str(index)] = _Tracking(planned, send_s, chosen)
            continue
        if next_step is None:
            break
        step = next_step.scheduler.step(next_step.clock_s)
        end_s = step.end_s
        next_step.clock_s = end_s
        accumulate_stats(next_step.stats, step)
        for request_id, _tokens in step.tokens:
            item = tracking[request_id]
            if item.first_token_s is None:
                item.first_token_s = end_s
            if record_token_times:
                item.token_times_s.append(end_s)
        for request_id in step.preempted:
            tracking[request_id].preemptions += 1
        for request_id in step.finished:
            item = tracking[request_id]
            item.finished_s = end_s
            replicas[item.replica].outstanding -= 1
            if closed_loop and next_unsent < count:
                heapq.heappush(pending, (end_s, next_unsent, next_unsent))
                next_unsent += 1

    epoch = time.time()
    records = [_record(tracking[str(request.index)], epoch, load) for request in requests]
    summary = summarize(records, slo)
    summary["meta"] = _meta(setup, load, label, config, count)
    stats = [replica.stats for replica in replicas]
    summary["simulation"] = _simulation_block(stats, config)
    return SimulationOutput(RunResult(records=records, summary=summary), stats, time.perf_counter() - started)


def estimated_request_s(setup: PlanSetup, requests: list[PlannedRequest], concurrency: int) -> float:
    """Rough time one request takes at this concurrency in steady state.

    Each step decodes for every running request and, on average, prefills the prompts of
    the requests that replace the ones finishing: concurrency × prompt / output tokens.
    """
    cost = setup.cost_model()
    prompt = sum(request.prompt_tokens for request in requests) / len(requests)
    output = max(sum(request.output_tokens for request in requests) / len(requests), 1.0)
    batch = max(min(concurrency, setup.max_num_seqs or concurrency), 1)
    prefill_per_step = int(batch * prompt / output)
    context = int(prompt + output / 2)
    step = StepContents(
        prefill_tokens=prefill_per_step,
        prefill_seqs=1 if prefill_per_step else 0,
        decode_seqs=batch,
        kv_tokens_read=batch * context + prefill_per_step,
    )
    return output * cost.step_time_s(step)


def _record(item: _Tracking, epoch: float, load: LoadSpec) -> RequestRecord:
    """A bench RequestRecord on the wall clock of the run's start."""
    planned = item.planned
    times = [epoch + value for value in item.token_times_s]
    return RequestRecord(
        request_id=f"sim-{planned.index}",
        scheduled_at_s=epoch + (planned.arrival_s if load.rate is not None else item.sent_s),
        sent_at_s=epoch + item.sent_s,
        first_token_at_s=None if item.first_token_s is None else epoch + item.first_token_s,
        finished_at_s=None if item.finished_s is None else epoch + item.finished_s,
        chunk_times_s=times,
        chunk_tokens=[1] * len(times),
        prompt_tokens=planned.prompt_tokens,
        output_tokens=len(item.token_times_s) if item.token_times_s else planned.output_tokens,
        requested_prompt_tokens=planned.prompt_tokens - planned.image_tokens,
        requested_output_tokens=planned.output_tokens,
        image_count=planned.images,
        ok=item.finished_s is not None,
        error_kind=None if item.finished_s is not None else "not_finished",
        workload=load.dataset,
        worker=item.replica,
        warmup=planned.index < load.warmup,
        simulated=True,
    )


def _meta(setup: PlanSetup, load: LoadSpec, label: str | None, config: Any, count: int) -> dict[str, Any]:
    return {
        "run_id": None,
        "label": label or f"plan {setup.model.name} {setup.replicas}x{setup.tp}x{setup.gpu.key}",
        "target": f"planner:{setup.gpu.key}",
        "model": setup.model.name,
        "server_version": "vlmserve planner (simulated)",
        "load_spec": load.model_dump(mode="json") | {"num_requests": count},
        "deployment": setup.describe(),
        "started_at": datetime.now(timezone.utc).isoformat(),
        "simulated": True,
        "simulation_id": uuid.uuid4().hex[:12],
        "kv_cache_tokens_per_replica": config.num_kv_blocks * config.block_size,
    }


def _simulation_block(stats: list[SimulationStats], config: Any) -> dict[str, Any]:
    return {
        "steps": sum(item.steps for item in stats),
        "preemptions": sum(item.num_preemptions for item in stats),
        "max_num_running": max(item.max_num_running for item in stats),
        "max_num_waiting": max(item.max_num_waiting for item in stats),
        "max_kv_usage": max(item.max_kv_usage for item in stats),
        "kv_blocks_per_replica": config.num_kv_blocks,
        "busy_s_per_replica": [round(item.busy_s, 3) for item in stats],
    }
