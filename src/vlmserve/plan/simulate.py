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
from datetime import datetime, timezone
from dataclasses import dataclass
from typing import Any

from vlmserve.results.metrics import summarize
from vlmserve.results.run import RunResult
from vlmserve.errors import UserError
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.workload import ImageMix, PlannedRequest, planned_requests
from vlmserve.results.records import RequestRecord
from vlmserve.sched.frontend import FrontendConfig, ImageItem
from vlmserve.sched.scheduler import Scheduler, SimRequest
from vlmserve.sched.virtual_clock import RequestTiming, Send, SimulationStats, run_virtual_clock
from vlmserve.sched.step_cost import StepContents
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
    per_image = planned.image_tokens // planned.images if planned.images else 0
    items = tuple(ImageItem(digest, planned.image_pixels, per_image) for digest in planned.image_digests)
    return SimRequest(
        request_id=str(planned.index),
        prompt_token_ids=list(range(base, base + planned.prompt_tokens)),
        max_output_tokens=planned.output_tokens,
        arrival_s=arrival_s,
        image_tokens=planned.image_tokens,
        images=planned.images,
        image_items=items,
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
    images: ImageMix | None = None,
) -> SimulationOutput:
    """Simulate `load` against `setup` and summarize it exactly as a measured run.

    Closed loop starts all `concurrency` clients at once, as `vlmserve bench` does. With
    `staggered=True` client i starts i/concurrency of an estimated request time later:
    the steady state a long closed-loop run reaches once output lengths vary, without a
    synchronized first wave of prefills (which fixed lengths would otherwise keep in lockstep).
    `images` says which requests carry images and how often they repeat (images dataset); every
    request passes each replica's frontend stage (`setup.frontend`) before its scheduler.
    """
    started = time.perf_counter()
    count = _default_count(load)
    image_tokens = setup.model.vision.default_tokens_per_image if setup.model.vision else 0
    if load.dataset == "images" and setup.model.vision is None:
        raise UserError(f"{setup.model.name} has no vision tower (no vision_config); use a text dataset or a VLM")
    requests = planned_requests(load, count, image_tokens, images)
    longest = max(request.prompt_tokens + request.output_tokens for request in requests)
    typical = int(sum(request.prompt_tokens + request.output_tokens / 2 for request in requests) / len(requests))
    config = setup.scheduler_config(typical, longest)
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
    timings, stats = run_virtual_clock(cores, sends, routing=setup.routing, next_send=next_send,
                                       record_token_times=record_token_times, frontend=setup.frontend)

    epoch = time.time()
    records = [_record(timings[str(request.index)], request, epoch, load) for request in requests]
    summary = summarize(records, slo)
    summary.meta = _meta(setup, load, label, config, count)
    summary.simulation = _simulation_block(stats, config) | {"frontend": _frontend_block(timings, stats, setup.frontend)}
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
    record = timing.to_request_record(
        epoch_s=epoch,
        request_id=f"sim-{planned.index}",
        scheduled_s=planned.arrival_s if load.rate is not None else timing.sent_s,
        requested_prompt_tokens=planned.prompt_tokens - planned.image_tokens,
        requested_output_tokens=planned.output_tokens,
        workload=load.dataset,
        warmup=planned.index < load.warmup,
    )
    record.image_repeat = planned.image_repeat
    return record


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


def _frontend_block(timings: dict[str, RequestTiming], stats: list[SimulationStats], frontend: FrontendConfig) -> dict[str, Any]:
    """The API server stage's figures: how busy it was, how long requests waited there and in the scheduler.

    Utilisation is the offered load per API server, ρ = image request rate × preprocessing per
    image request / servers: API-server busy time over (servers × the span of arrivals), the
    busiest replica reported. Near 1 requests queue for preprocessing; above 1 the queue grows
    for as long as the load lasts.
    """
    values = list(timings.values())
    arrivals = [timing.arrival_s for timing in values]
    span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    if span <= 1e-6:  # one burst: fall back to the run's length
        span = max((timing.finished_s or timing.arrival_s for timing in values), default=0.0) - min(arrivals, default=0.0)
    span = max(span, 1e-9)
    image_requests = sum(item.image_requests for item in stats)
    queue = [timing.queue_time_s for timing in values if timing.queue_time_s is not None]
    preprocess = [timing.preprocess_s for timing in values if timing.images]
    return {
        "api_server_count": frontend.api_server_count,
        "utilisation": max(item.frontend_busy_s / (frontend.api_server_count * span) for item in stats) if stats else 0.0,
        "image_requests": image_requests,
        "image_request_rate": image_requests / span,
        "mean_preprocess_ms_per_image_request": 1000.0 * sum(preprocess) / len(preprocess) if preprocess else 0.0,
        "mean_frontend_wait_ms": 1000.0 * sum(item.frontend_wait_s for item in stats) / max(len(values), 1),
        "max_frontend_wait_ms": 1000.0 * max((item.max_frontend_wait_s for item in stats), default=0.0),
        "mean_scheduler_queue_ms": 1000.0 * sum(queue) / len(queue) if queue else 0.0,
        "mm_cache_queries": sum(item.mm_cache_queries for item in stats),
        "mm_cache_hits": sum(item.mm_cache_hits for item in stats),
    }
