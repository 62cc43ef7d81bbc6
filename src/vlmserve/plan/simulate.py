"""Simulated runs: the shared vLLM scheduler model, priced by the roofline, on a virtual clock.

N replicas (each its own `Scheduler` and clock) sit behind a routing policy; requests
arrive open loop (at the load's rate) or closed loop (a new one when one finishes, at the
load's concurrency). The clock jumps from event to event, so thousands of requests
simulate in well under a second. The output is what `vlmserve bench` produces — one
`RequestRecord` per request (marked simulated) and a `RunResult` whose summary comes
from the bench's own `metrics.summarize` — so `report` and `compare` work on it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from vlmserve.errors import UserError
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.workload import PlannedRequest, planned_requests
from vlmserve.results.blocks import RunMeta, SimulatedFrontend, SimulationBlock
from vlmserve.results.metrics import summarize
from vlmserve.results.records import RequestRecord
from vlmserve.results.run import RunResult
from vlmserve.sched.scheduler import Scheduler, SchedulerConfig, SimRequest
from vlmserve.sched.step_cost import StepContents
from vlmserve.sched.virtual_clock import RequestTiming, Send, SimulationStats, run_virtual_clock
from vlmserve.spec import SLO, LoadSpec

TOKEN_ID_STRIDE = 1 << 24
"""Each request's prompt ids start at index·stride: distinct prompts, no false prefix hits."""


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
        image_items=planned.image_items,
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
    max_num_encoder_input_tokens: int | None = None,
    encoder_cache_size: int | None = None,
) -> SimulationOutput:
    """Simulate `load` against `setup` and summarize it exactly as a measured run.

    Closed loop starts all `concurrency` clients at once, as `vlmserve bench` does. With
    `staggered=True` client i starts i/concurrency of an estimated request time later:
    the steady state a long closed-loop run reaches once output lengths vary, without a
    synchronized first wave of prefills (which fixed lengths would otherwise keep in lockstep).
    """
    started = time.perf_counter()
    count = _default_count(load)
    vision = setup.model.vision
    if load.dataset == "images" and vision is None:
        raise UserError(f"{setup.model.name} has no vision tower (no vision_config); use a text dataset or a VLM")
    requests = planned_requests(load, count, vision.tokens_for if vision else lambda _w, _h: 0)
    longest = max(request.prompt_tokens + request.output_tokens for request in requests)
    typical = int(sum(request.prompt_tokens + request.output_tokens / 2 for request in requests) / len(requests))
    config = replace(
        setup.scheduler_config(typical, longest),
        encoder_cache_size=encoder_cache_size,
        max_num_encoder_input_tokens=max_num_encoder_input_tokens,
    )  # vLLM's encoder budget
    cost = setup.cost_model()
    overhead_s = setup.efficiency.request_overhead_s
    try:
        cores = [Scheduler(config, cost) for _ in range(setup.replicas)]
    except ValueError as err:  # engine limits vLLM would refuse to start with
        raise UserError(f"{setup.model.name} on {setup.tp}× {setup.gpu.name}: {err}") from None

    def send(send_s: float, index: int) -> Send:
        # the request reaches the engine after HTTP + tokenize
        return Send(send_s, index, _sim_request(requests[index], send_s + overhead_s))

    # Closed loop starts `concurrency` clients at t=0 and sends the next request when one
    # finishes; open loop has every send time up front.
    sends: list[Send]
    next_send = None
    if load.rate is None:
        clients = min(load.concurrency or 1, count)
        spacing = estimated_request_s(setup, requests, clients) / clients if staggered else 0.0
        sends = [send(client * spacing, client) for client in range(clients)]
        unsent = iter(range(clients, count))

        def next_send(finished_s: float) -> Send | None:
            index = next(unsent, None)
            return None if index is None else send(finished_s, index)
    else:
        sends = [send(request.arrival_s, request.index) for request in requests]
    timings, stats = run_virtual_clock(
        cores, sends, routing=setup.routing, next_send=next_send, record_token_times=record_token_times, frontend=setup.frontend
    )

    epoch = time.time()
    records = [_record(timings[str(request.index)], request, epoch, load) for request in requests]
    summary = summarize(records, slo)
    summary.meta = _meta(setup, load, label, config, count)
    summary.simulation = _simulation_block(stats, config)
    frontend = _frontend_block(setup, timings, stats, load)
    if frontend is not None:
        summary.simulation.frontend = frontend
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


def _record(timing: RequestTiming, planned: PlannedRequest, epoch: float, load: LoadSpec) -> RequestRecord:
    """A bench RequestRecord on the wall clock of the run's start."""
    return timing.to_request_record(
        epoch_s=epoch,
        request_id=f"sim-{planned.index}",
        scheduled_s=planned.arrival_s if load.rate is not None else timing.sent_s,
        requested_prompt_tokens=planned.prompt_tokens - planned.image_tokens,
        requested_output_tokens=planned.output_tokens,
        workload=load.dataset,
        warmup=planned.index < load.warmup,
    )


def _meta(setup: PlanSetup, load: LoadSpec, label: str | None, config: SchedulerConfig, count: int) -> RunMeta:
    return RunMeta(
        run_id=None,
        label=label or f"plan {setup.model.name} {setup.replicas}x{setup.tp}x{setup.gpu.key}",
        target=f"planner:{setup.gpu.key}",
        model=setup.model.name,
        server_version="vlmserve planner (simulated)",
        load_spec=load.model_dump(mode="json") | {"num_requests": count},
        deployment=setup.describe(),
        started_at=datetime.now(timezone.utc).isoformat(),
        simulated=True,
        simulation_id=uuid.uuid4().hex[:12],
        kv_cache_tokens_per_replica=config.num_kv_blocks * config.block_size,
    )


def _frontend_block(
    setup: PlanSetup, timings: dict[str, RequestTiming], stats: list[SimulationStats], load: LoadSpec
) -> SimulatedFrontend | None:
    """The frontend (image preprocessing) as simulated: how busy its API servers were, how long
    requests waited there against the engine's own queue, and the multimodal cache hit rate."""
    queries = sum(item.mm_cache_queries for item in stats)
    if not queries:
        return None
    with_images = [timing for timing in timings.values() if timing.images or timing.mm_cache_hits]
    span = max((timing.finished_s or 0.0) for timing in timings.values()) - min(t.sent_s for t in timings.values())
    busy = [item.frontend_busy_s for item in stats]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return SimulatedFrontend(
        api_server_count=setup.frontend.api_server_count,
        utilization=max(busy) / (span * setup.frontend.api_server_count) if span > 0 else 0.0,
        mean_frontend_s=mean([timing.frontend_s for timing in with_images]),
        mean_engine_queue_s=mean([timing.queue_time_s or 0.0 for timing in with_images]),
        mm_cache_hit_rate=sum(item.mm_cache_hits for item in stats) / queries,
        stated_repeat_rate=load.image_repeat_rate,
        per_image_ms=setup.frontend.per_image_ms,
        per_megapixel_ms=setup.frontend.per_megapixel_ms,
    )


def _simulation_block(stats: list[SimulationStats], config: SchedulerConfig) -> SimulationBlock:
    return SimulationBlock(
        steps=sum(item.steps for item in stats),
        preemptions=sum(item.num_preemptions for item in stats),
        max_num_running=max(item.max_num_running for item in stats),
        max_num_waiting=max(item.max_num_waiting for item in stats),
        max_kv_usage=max(item.max_kv_usage for item in stats),
        kv_blocks_per_replica=config.num_kv_blocks,
        busy_s_per_replica=[round(item.busy_s, 3) for item in stats],
    )
