"""Measure one candidate: start it from its own spec, verify it, warm it, search its goodput, stop it.

Each candidate gets a fresh deployment (its own name, free ports, its logs under the tune
directory), so no configuration serves another's traffic and a failed start leaves its log where
the store points. The supervisor verifies the served configuration at start (as `up` does); a
models check follows. Goodput is the SLO search's answer (bench.slo_search): the highest request
rate at which the SLOs hold, with the interval the bisection leaves (held at `low`, missed at
`high`); every probe is a stored run in the history. Ctrl-C is not swallowed by the bench here
(`stop_on_ctrl_c=False`): it ends the tune, and the candidate in flight is measured again on resume.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from vlmserve.bench.slo_search import SearchOutcome, SearchSpace, search
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.results.run import RunResult
from vlmserve.spec import SLO, DeploymentSpec, LoadSpec

WARMUP_REQUESTS = 4
"""Requests sent (and not kept) after a candidate is ready, so its first probe does not pay for cold caches."""


@dataclass
class Measurement:
    """What one candidate's measurement found (`failed` with a reason and a log, or a goodput)."""

    goodput_rps: float | None = None
    low: float = 0.0
    high: float | None = None
    search_status: str | None = None
    run_ids: list[str] = field(default_factory=list)
    held_run_id: str | None = None
    ttft_p95_ms: float | None = None
    """p95 TTFT of the run at the highest rate that held (the latency the goodput comes with)."""
    reason: str | None = None
    log: str | None = None
    wall_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.reason is not None


def candidate_dirs(directory: Path, candidate_id: str) -> tuple[Path, Path]:
    """(state directory, log directory) of one candidate's deployment inside the tune directory."""
    base = directory / "candidates" / candidate_id
    return base / "state", base / "logs"


def measure(
    spec: DeploymentSpec,
    candidate_id: str,
    template: LoadSpec,
    slo: SLO,
    space: SearchSpace,
    directory: Path,
    label: str,
    console: Console,
) -> Measurement:
    """Deploy, verify, warm and search one candidate; a failure is a Measurement with its reason and log."""
    from vlmserve.deploy.supervisor import Supervisor
    from vlmserve.engines.launcher import served_model_name
    from vlmserve.sweep.hygiene import verify_serving, with_free_ports
    from vlmserve.sweep.runner import failed_run_reason, one_line

    started = time.monotonic()
    state_dir, log_dir = candidate_dirs(directory, candidate_id)
    spec = spec.model_copy(update={"name": f"{spec.name}-tune-{candidate_id}", "log_dir": str(log_dir)})
    outcome = Measurement()
    try:
        spec = with_free_ports(spec)
        with Supervisor(spec, state_dir=state_dir) as supervisor:
            base_url = supervisor.endpoint.rstrip("/")
            model = served_model_name(spec)
            verify_serving(base_url, model, spec.engine_args.max_model_len)
            deployment = spec.model_dump(mode="json")
            warm = _run(
                template.model_copy(
                    update={
                        "rate": None,
                        "concurrency": 2,
                        "num_requests": WARMUP_REQUESTS,
                        "duration_s": None,
                        "repeat": 1,
                        "warmup": 0,
                        "name": "warmup",
                        "seed": template.seed + 100_000,
                    }
                ),
                base_url,
                model,
                None,
                f"{label} warmup",
                deployment,
                console,
                store=False,
            )
            reason = failed_run_reason(warm)
            if reason:
                raise UserError(f"warm-up failed: {reason}")
            found = asyncio.run(
                search(template, slo, space, _run_point(base_url, model, slo, label, deployment, console), console)
            )
            _fill(outcome, found)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # a candidate that cannot start or serve is a result; the tune goes on
        outcome.reason = one_line(err)
        outcome.log = _log_of(log_dir)
    outcome.wall_s = round(time.monotonic() - started, 2)
    return outcome


def _fill(outcome: Measurement, found: SearchOutcome) -> None:
    held, missed = found.held, found.missed
    outcome.search_status = found.status
    outcome.run_ids = [probe.run_id for probe in found.probes if probe.run_id]
    outcome.goodput_rps = held.level if held is not None else 0.0
    outcome.low = held.level if held is not None else 0.0
    outcome.high = missed.level if missed is not None else None
    if held is not None:
        outcome.held_run_id = held.run_id
        outcome.ttft_p95_ms = held.result.summary.figure("ttft_ms.p95")


def _run(
    load: LoadSpec,
    base_url: str,
    model: str,
    slo: SLO | None,
    label: str,
    deployment: JSONObject,
    console: Console,
    *,
    store: bool = True,
) -> RunResult:
    from vlmserve.bench.repeats import run_repeated
    from vlmserve.bench.target import Target

    result = asyncio.run(
        run_repeated(
            load,
            Target(base_url=base_url, model=model),
            slo=slo,
            progress=False,
            label=label,
            deployment=deployment,
            console=console,
            stop_on_ctrl_c=False,
        )
    )
    if store:
        from vlmserve.results import store as run_store

        run_store.save_run(result)
    return result


def _run_point(
    base_url: str, model: str, slo: SLO, label: str, deployment: JSONObject, console: Console
) -> Callable[[LoadSpec, Callable[[list[RunResult]], bool]], Awaitable[RunResult]]:
    """The SLO search's probe runner: every repeat of one level against this candidate, stored."""
    from vlmserve.bench.repeats import run_repeated
    from vlmserve.bench.target import Target
    from vlmserve.results import store as run_store

    target = Target(base_url=base_url, model=model)

    async def run_point(load: LoadSpec, settled: Callable[[list[RunResult]], bool]) -> RunResult:
        result = await run_repeated(
            load,
            target,
            slo=slo,
            settled=settled,
            console=console,
            progress=False,
            label=f"{label} {load.name}",
            deployment=deployment,
            stop_on_ctrl_c=False,
        )
        run_store.save_run(result)
        return result

    return run_point


def _log_of(log_dir: Path) -> str:
    """The first replica's log (where an engine says why it did not start), else the log directory."""
    logs = sorted(log_dir.glob("replica-*.log"))
    return str(logs[0] if logs else log_dir)
