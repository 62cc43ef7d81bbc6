"""Which candidate to measure next: the baseline, then the planner's best, then Optuna's TPE.

Why this order: the baseline is the figure every other candidate is judged against, so it is
measured first. Where the planner has a model of the engine, its simulated ranking is the
cheapest information there is, so the first half of the measurement budget goes to its best
predictions. The rest goes to Optuna's TPE sampler (the library the OpenShift tuner uses),
which learns from every measured goodput, including the planner's picks, and is not bound to
the planner's errors. A point TPE proposes again is closed as failed (so the
repeat does not count twice in its model) and it is asked again; after `MAX_ASKS` repeats the best-predicted (else the first) unmeasured
candidate is taken.

The study is rebuilt from the store at every step with a seed that depends on how many
candidates are finished, so a resumed tune proposes what an uninterrupted one would have.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from vlmserve.errors import UserError
from vlmserve.tune.space import Candidate, TuneSpace
from vlmserve.tune.store import CandidateRecord

if TYPE_CHECKING:
    from vlmserve.tune.predict import Prediction

MAX_ASKS = 50
"""Proposals of already-measured points TPE may make in a row before the fallback decides."""

TUNE_EXTRA = "vlmserve[tune]"


def require_optuna() -> ModuleType:
    """The optuna module, or one line naming the extra to install."""
    try:
        import optuna
    except ImportError:
        raise UserError(f"vlmserve tune needs Optuna; install it with: pip install '{TUNE_EXTRA}'") from None
    return optuna


@dataclass(frozen=True)
class Proposal:
    candidate: Candidate
    why: str
    """'baseline', 'planner' or 'optuna' (or 'fallback': the sampler kept repeating itself)."""


class Proposer:
    """Next candidate to measure, given what the store holds."""

    def __init__(self, space: TuneSpace, predictions: dict[str, "Prediction"], budget: int, seed: int = 0) -> None:
        self.space = space
        self.candidates = space.candidates()
        self.predictions = predictions
        self.budget = budget
        self.seed = seed
        self.optuna = require_optuna()

    def planner_order(self) -> list[Candidate]:
        """Candidates by simulated goodput, best first (those it cannot price or start last)."""

        def key(candidate: Candidate) -> tuple[float, int]:
            prediction = self.predictions.get(candidate.id)
            value = prediction.goodput_rps if prediction and prediction.goodput_rps is not None else -1.0
            return (-value, self.candidates.index(candidate))

        return sorted(self.candidates, key=key)

    def next(self, records: list[CandidateRecord]) -> Proposal | None:
        done = {record.id for record in records}
        pending = [candidate for candidate in self.candidates if candidate.id not in done]
        if not pending:
            return None
        baseline = self.candidates[0]
        if baseline.id not in done:
            return Proposal(baseline, "baseline")
        planner_slots = math.ceil(max(self.budget - 1, 0) / 2) if self.predictions else 0
        planner_turn = sum(1 for record in records if not record.baseline) < planner_slots
        if planner_turn and any(prediction.goodput_rps is not None for prediction in self.predictions.values()):
            best = next(candidate for candidate in self.planner_order() if candidate.id not in done)
            return Proposal(best, "planner")
        return self._optuna_next(records, pending)

    def _optuna_next(self, records: list[CandidateRecord], pending: list[Candidate]) -> Proposal:
        optuna = self.optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        distributions = {axis.name: optuna.distributions.CategoricalDistribution(list(axis.values)) for axis in self.space.axes}
        sampler = optuna.samplers.TPESampler(seed=self.seed + len(records), n_startup_trials=3)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        by_key = {_key(candidate.params): candidate for candidate in self.candidates}
        recorded: dict[str, float | None] = {}
        for record in records:
            if _key(record.params) not in by_key or any(value is None for value in record.params.values()):
                continue  # an off-grid baseline has no place in the sampler's space
            value = record.goodput_rps if record.status == "measured" else None
            recorded[_key(record.params)] = value
            state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
            study.add_trial(
                optuna.trial.create_trial(state=state, value=value, params=dict(record.params), distributions=distributions)
            )
        for _ in range(MAX_ASKS):
            trial = study.ask(distributions)
            key = _key(trial.params)
            if key not in recorded:
                return Proposal(by_key[key], "optuna")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)  # a repeat teaches nothing: not counted
        ranked = [candidate for candidate in self.planner_order() if candidate in pending]
        return Proposal(ranked[0], "fallback")


def _key(params: Mapping[str, object]) -> str:
    return json.dumps(params, sort_keys=True)
