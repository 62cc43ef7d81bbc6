"""A tune from start to recommendation: plan every candidate, measure the proposed ones, keep each in the store.

One candidate at a time (they share the machine): the proposer picks it, `measure` deploys and
searches it, the store records it before the next starts. The budget is `max_candidates` (all
attempts, the failed ones too, counted over every resumed run) and `max_time_s` (this run's wall
time; a candidate started is finished). Ctrl-C or SIGTERM ends the run with every finished candidate
kept; the same command resumes it.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rich.console import Console

from vlmserve.bench.slo_search import SearchSpace
from vlmserve.errors import UserError
from vlmserve.spec import SLO, LoadSpec
from vlmserve.tune.measure import measure
from vlmserve.tune.predict import Prediction, can_predict, predict
from vlmserve.tune.propose import Proposer, require_optuna
from vlmserve.tune.recommend import Recommendation, recommend
from vlmserve.tune.space import Candidate, TuneSpace
from vlmserve.tune.store import CandidateRecord, Interval, TuneStore

MIN_CANDIDATES = 2
"""The default budget never goes below the baseline and one other candidate."""

SPACE_SHARE = 3
"""The default budget: a third of the space (measured, the rest only predicted)."""


@dataclass(frozen=True)
class TuneSettings:
    """What is measured (workload, SLO, the rate search) and how much may be spent."""

    template: LoadSpec
    slo: SLO
    search: SearchSpace
    max_candidates: int | None = None
    max_time_s: float | None = None
    seed: int = 0
    plan: bool = True

    def budget(self, space_size: int) -> int:
        if self.max_candidates is not None:
            return self.max_candidates
        return min(space_size, max(MIN_CANDIDATES, space_size // SPACE_SHARE))

    def fingerprint_data(self) -> dict[str, object]:
        return {
            "load": self.template.model_dump(mode="json"),
            "slo": self.slo.model_dump(mode="json"),
            "search": {
                "knob": self.search.knob,
                "low": self.search.low,
                "high": self.search.high,
                "precision": self.search.precision,
                "max_probes": self.search.max_probes,
            },
            "seed": self.seed,
            "plan": self.plan,
        }


@dataclass
class TuneOutcome:
    """Everything the outputs need: the space, the plan, the store's records, the choice."""

    space: TuneSpace
    settings: TuneSettings
    directory: Path
    predictions: dict[str, Prediction]
    plan_note: str | None
    records: list[CandidateRecord]
    recommendation: Recommendation
    budget: int
    stopped_by: str = "space measured"
    notes: list[str] = field(default_factory=list)


def fingerprint(space: TuneSpace, settings: TuneSettings) -> str:
    text = json.dumps({"space": space.fingerprint_data(), "settings": settings.fingerprint_data()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_candidates(space: TuneSpace, settings: TuneSettings, console: Console) -> tuple[dict[str, Prediction], str | None]:
    """The planner's simulated goodput of every candidate, or ({}, why there is none)."""
    if not settings.plan:
        return {}, "planner ranking off (--no-plan)"
    why_not = can_predict(space.base)
    if why_not is not None:
        return {}, why_not
    console.print(f"planning {len(space.candidates())} candidates (simulated)")
    predictions = {}
    for candidate in space.candidates():
        predictions[candidate.id] = predict(space.spec_for(candidate), settings.template, settings.slo, settings.search)
    return predictions, None


def run_tune(
    space: TuneSpace, settings: TuneSettings, directory: Path, *, restart: bool = False, console: Console | None = None
) -> TuneOutcome:
    """Plan, then measure within the budget; returns the outcome (also when the budget stops it)."""
    require_optuna()
    console = console or Console(stderr=True)
    study = {
        "base": space.base.name,
        "flags": {axis.name: list(axis.values) for axis in space.axes},
        **settings.fingerprint_data(),
    }
    store = TuneStore(directory, fingerprint(space, settings), study, restart=restart)
    candidates = space.candidates()
    budget = settings.budget(len(candidates))
    if store.records:
        console.print(f"resuming the tune in {directory}: {len(store.records)} of {budget} candidates already done")
    predictions, plan_note = plan_candidates(space, settings, console)
    if plan_note:
        console.print(f"measuring in Optuna's order: {plan_note}")
    proposer = Proposer(space, predictions, budget, settings.seed)
    started = time.monotonic()
    stopped_by = "space measured"
    try:
        with ctrl_c_ends_the_tune() as interrupted:
            stopped_by = _measure_within_budget(
                space, settings, store, predictions, proposer, budget, directory, console, started, interrupted
            )
    except KeyboardInterrupt:
        store.add_elapsed(time.monotonic() - started)
        raise UserError(
            f"tune interrupted; {len(store.records)} candidate(s) finished and kept in {directory}; "
            "rerun the same command to resume",
            exit_code=130,
        ) from None
    store.add_elapsed(time.monotonic() - started)
    records = store.records
    return TuneOutcome(space, settings, directory, predictions, plan_note, records, recommend(records), budget, stopped_by)


@contextmanager
def ctrl_c_ends_the_tune() -> Iterator[Callable[[], bool]]:
    """Ctrl-C ends the tune wherever it lands; yields "was Ctrl-C pressed?".

    Why not asyncio's own handling: asyncio.run turns SIGINT into a cancellation of its main task,
    and a cancellation swallowed on the way (a library's clean-up) would let the tune go on to the
    next candidate. This handler raises KeyboardInterrupt at once and remembers the press, so the
    loop stops before the next candidate even if that KeyboardInterrupt was swallowed too."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield lambda: False
        return

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        pressed.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)


def _measure_within_budget(
    space: TuneSpace,
    settings: TuneSettings,
    store: TuneStore,
    predictions: dict[str, Prediction],
    proposer: Proposer,
    budget: int,
    directory: Path,
    console: Console,
    started: float,
    interrupted: Callable[[], bool],
) -> str:
    """Measure the proposer's candidates one by one until a budget or the space ends; says which."""
    while True:
        if interrupted():
            raise KeyboardInterrupt
        if len(store.records) >= budget:
            return f"budget: {budget} candidates"
        if settings.max_time_s is not None and time.monotonic() - started >= settings.max_time_s:
            return f"budget: {settings.max_time_s:g} s"
        proposal = proposer.next(store.records)
        if proposal is None:
            return "space measured"
        position = f"{len(store.records) + 1}/{budget}"
        _measure_one(proposal.candidate, proposal.why, space, settings, store, predictions, directory, console, position)


def _measure_one(
    candidate: Candidate,
    why: str,
    space: TuneSpace,
    settings: TuneSettings,
    store: TuneStore,
    predictions: dict[str, Prediction],
    directory: Path,
    console: Console,
    position: str,
) -> None:
    prediction = predictions.get(candidate.id)
    predicted = prediction.goodput_rps if prediction else None
    hint = f", predicted {predicted:g} req/s (simulated)" if predicted is not None else ""
    console.print(f"[bold][{position}][/] {candidate.label} ({why}{hint})")
    found = measure(
        space.spec_for(candidate),
        candidate.id,
        settings.template,
        settings.slo,
        settings.search,
        directory,
        f"tune {space.base.name}/{candidate.id}",
        console,
    )
    record = CandidateRecord(
        id=candidate.id,
        label=candidate.label,
        params=dict(candidate.params),
        baseline=candidate.baseline,
        order=len(store.records),
        status="failed" if found.failed else "measured",
        goodput_rps=found.goodput_rps,
        interval=None if found.failed else Interval(low=found.low, high=found.high),
        search_status=found.search_status,
        predicted_rps=predicted,
        run_ids=found.run_ids,
        held_run_id=found.held_run_id,
        ttft_p95_ms=found.ttft_p95_ms,
        devices=_devices(space, candidate),
        reason=found.reason,
        log=found.log,
        wall_s=found.wall_s,
    )
    store.record(record)
    if record.status == "failed":
        where = "" if record.log and record.log in (record.reason or "") else f" (log: {record.log})"
        console.print(f"  [red]✗ failed[/]: {record.reason}{where}")
    else:
        high = "" if found.high is None else f", missed at {found.high:g}"
        console.print(
            f"  [green]✓[/] goodput {found.goodput_rps:g} req/s (held at {found.low:g}{high}; "
            f"{found.search_status}, {found.wall_s:.0f} s)"
        )


def _devices(space: TuneSpace, candidate: Candidate) -> int:
    """Devices the candidate uses (replicas × tensor parallel), for goodput per device."""
    spec = space.spec_for(candidate)
    return spec.replicas * spec.engine_args.tensor_parallel_size
