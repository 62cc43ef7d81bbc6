"""Plan before measuring: the simulated goodput of every candidate, to measure the promising ones first.

For a sim-engine spec the planner runs the candidate's own engine model — vLLM's scheduler rules
(sched) on the spec's step-cost profile, with its serving limits and any rehearsal optimum, as
`engines.sim.launcher` would start it — on the virtual clock shared with `vlmserve plan`, and
searches the same rate range with the same bisection as the measured SLO search. Every number
here is simulated, and labelled so wherever it is shown.

Where no model of the engine on this machine exists (a vLLM spec: the planner's kernel tables
and roofline price GPUs, not the CPU build), `predict` answers None for every candidate and the
search order is Optuna's alone; the report says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vlmserve.bench.slo_search import SearchSpace
from vlmserve.errors import UserError
from vlmserve.plan.simulate import TOKEN_ID_STRIDE
from vlmserve.plan.workload import PlannedRequest, planned_requests
from vlmserve.results.metrics import summarize
from vlmserve.sched.scheduler import SimRequest
from vlmserve.sched.virtual_clock import Send, run_virtual_clock
from vlmserve.spec import SLO, DeploymentSpec, LoadSpec

MIN_SIMULATED_REQUESTS = 200
"""Requests per simulated probe at least: enough for a p95 that does not jump with one request."""


@dataclass(frozen=True)
class Prediction:
    """The planner's simulated goodput of one candidate (None when it would not start: `reason`)."""

    goodput_rps: float | None
    reason: str | None = None


def can_predict(spec: DeploymentSpec) -> str | None:
    """None when the planner has a model of this spec's engine; else why not, in a few words."""
    if spec.engine != "sim":
        return "no planner model of the vLLM engine on this machine (the planner prices GPUs)"
    if spec.sim.ttft_ms is not None or spec.sim.itl_ms is not None:
        return "the sim engine runs in constant-latency mode (nothing to rank)"
    return None


def predict(spec: DeploymentSpec, template: LoadSpec, slo: SLO, space: SearchSpace) -> Prediction:
    """Simulated goodput (req/s): the highest rate in `space` at which `slo` holds, by bisection."""
    from vlmserve.engines.sim.launcher import SimLauncher
    from vlmserve.engines.sim.options import build_engine_core

    configs = [SimLauncher(spec).engine_config(index) for index in range(spec.replicas)]
    try:
        for config in configs:
            config.validate()
    except UserError as err:
        return Prediction(None, f"would not start: {err.message}")
    image_tokens = configs[0].image_tokens

    def holds(rate: float) -> bool:
        load = template.model_copy(update={"rate": rate, "concurrency": None, "repeat": 1})
        count = max(MIN_SIMULATED_REQUESTS, _count(load))
        requests = planned_requests(load, count, lambda _w, _h: image_tokens)
        cores = [build_engine_core(config) for config in configs]
        sends = [Send(request.arrival_s, request.index, _sim_request(request)) for request in requests]
        timings, _ = run_virtual_clock(cores, sends, frontend=configs[0].frontend_config())
        epoch = time.time()
        records = [
            timings[str(request.index)].to_request_record(
                epoch_s=epoch,
                request_id=f"sim-{request.index}",
                scheduled_s=request.arrival_s,
                requested_prompt_tokens=request.prompt_tokens - request.image_tokens,
                requested_output_tokens=request.output_tokens,
                workload=load.dataset,
            )
            for request in requests
        ]
        summary = summarize(records, slo)
        return bool(summary.goodput and summary.goodput.all_met and summary.requests.failed == 0)

    if not holds(space.low):
        return Prediction(0.0)
    if holds(space.high):
        return Prediction(space.high)
    held, missed = space.low, space.high
    for _ in range(space.max_probes):
        if space.fine_enough(held, missed):
            break
        middle = space.midpoint(held, missed)
        if holds(middle):
            held = middle
        else:
            missed = middle
    return Prediction(held)


def _count(load: LoadSpec) -> int:
    if load.num_requests is not None:
        return load.num_requests
    return int((load.rate or 1.0) * (load.duration_s or 10.0))


def _sim_request(planned: PlannedRequest) -> SimRequest:
    base = planned.index * TOKEN_ID_STRIDE
    return SimRequest(
        request_id=str(planned.index),
        prompt_token_ids=list(range(base, base + planned.prompt_tokens)),
        max_output_tokens=planned.output_tokens,
        arrival_s=planned.arrival_s,
        image_tokens=planned.image_tokens,
        images=planned.images,
        image_items=planned.image_items,
    )
