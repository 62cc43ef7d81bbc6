"""Staged calibration fits and leave-one-group-out cross-validation.

A calibration fitted on some measurements and then scored on the same ones says little
about a configuration nobody measured. `cross_validate` gives the honest figure: for each
group of measurements (one published setup, say) it refits the calibration without that
group and predicts the group, so every error it reports is out-of-sample.

Fits run in stages because the physics separates: dense decode/prefill efficiency, MoE
kernels, one GPU's own efficiencies. Each stage fits a few coefficients on the rows that
exercise them, starting from what the earlier stages found, so one kind of row cannot
bend another's coefficients and each Nelder–Mead stays small (a few dozen simulations).
A stage whose rows are all held out is skipped: its coefficients stay at their prior.

Refits are memoised on (stage, rows, starting calibration): a fold that holds out a row
of a late stage reuses the early stages' results, which keeps a full cross-validation to
a few minutes of CPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vlmserve.hardware.calibration import Calibration
from vlmserve.plan.calibrate import Scenario, fit, predict


@dataclass(frozen=True)
class FitStage:
    """One step of a staged fit: which rows it uses and which coefficients it moves."""

    title: str
    rows: tuple[str, ...]
    """Scenario ids this stage fits on (those present in the fold)."""
    parameters: tuple[tuple[str, str], ...]
    """(target, coefficient): target is 'default' or a GPU key."""


@dataclass
class StagedFitter:
    """Runs staged fits, remembering each stage's result for reuse across folds."""

    stages: Sequence[FitStage]
    max_evaluations: int = 60
    progress: Callable[[str], None] | None = None
    simulations: int = 0
    _memo: dict[tuple[str, tuple[str, ...], str], Calibration] = field(default_factory=dict)

    def fit(self, scenarios: Sequence[Scenario], start: Calibration) -> Calibration:
        """The calibration after every stage that has rows among `scenarios`."""
        by_id = {scenario.scenario_id: scenario for scenario in scenarios}
        calibration = start
        for stage in self.stages:
            rows = tuple(row for row in stage.rows if row in by_id)
            if not rows:
                continue
            key = (stage.title, rows, _fingerprint(calibration))
            if key not in self._memo:
                if self.progress:
                    self.progress(f"stage '{stage.title}' on {', '.join(rows)}")
                result = fit([by_id[row] for row in rows], calibration, stage.parameters, max_evaluations=self.max_evaluations)
                self.simulations += result.evaluations * len(rows)
                self._memo[key] = result.calibration
            calibration = self._memo[key]
        return calibration


def _fingerprint(calibration: Calibration) -> str:
    """The coefficients of a calibration, as a stable string (source text left out)."""
    data = calibration.to_dict()
    return json.dumps({"default": data["default"], "per_gpu": data["per_gpu"]}, sort_keys=True)


@dataclass
class CrossValidation:
    """Out-of-fold predictions and the calibration each fold was predicted with."""

    predictions: dict[str, dict[str, float]]
    """scenario id → metric → value predicted by a calibration fitted without its group."""
    fold_calibrations: dict[str, Calibration]
    """group → the calibration fitted without it."""
    simulations: int


def cross_validate(
    scenarios: Sequence[Scenario], groups: dict[str, str], fitter: StagedFitter, start: Calibration
) -> CrossValidation:
    """Leave one group out: refit without it, predict it; every prediction is out-of-sample.

    `groups` maps a scenario id to its group (a scenario with no entry is its own group).
    """
    by_group: dict[str, list[Scenario]] = {}
    for scenario in scenarios:
        by_group.setdefault(groups.get(scenario.scenario_id, scenario.scenario_id), []).append(scenario)
    predictions: dict[str, dict[str, float]] = {}
    calibrations: dict[str, Calibration] = {}
    for group, held_out in by_group.items():
        held_ids = {scenario.scenario_id for scenario in held_out}
        training = [scenario for scenario in scenarios if scenario.scenario_id not in held_ids]
        if fitter.progress:
            fitter.progress(f"fold: hold out {group}")
        calibration = fitter.fit(training, start)
        calibrations[group] = calibration
        predictions.update(predict(held_out, calibration))
    return CrossValidation(predictions, calibrations, fitter.simulations)
