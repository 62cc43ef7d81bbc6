"""Staged fits and leave-one-out cross-validation on runs 'measured' with a known calibration."""

from __future__ import annotations

import pytest

from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.calibrate import Scenario, metric_value, predict
from vlmserve.plan.crossval import FitStage, StagedFitter, cross_validate
from vlmserve.plan.simulate import simulate_run
from vlmserve.spec import LoadSpec

TRUTH = Calibration(Efficiency(bandwidth=0.5, compute=0.4, step_overhead_s=0.002, request_overhead_s=0.0))
START = Calibration(Efficiency(bandwidth=0.7, compute=0.4, step_overhead_s=0.002, request_overhead_s=0.0))


def _measured(scenario_id: str, concurrency: int, gpu: str = "h100") -> Scenario:
    """A scenario whose 'measurements' are the truth calibration's own simulation."""
    load = LoadSpec(input_len=256, output_len=32, concurrency=concurrency, num_requests=3 * concurrency)

    def build(calibration: Calibration) -> PlanSetup:
        # the roofline: its bandwidth coefficient is what these fits recover (measured kernels do not use it)
        return PlanSetup.from_names("llama-3.1-8b", gpu, calibration=calibration, cost_model_kind="roofline")

    summary = simulate_run(build(TRUTH), load).result.summary
    measured = {
        metric: value for metric in ("mean_tpot_ms", "output_tok_s") if (value := metric_value(summary, metric)) is not None
    }
    return Scenario(scenario_id, build, load, measured)


def test_each_fold_is_fitted_without_its_row_and_predicts_it() -> None:
    scenarios = [_measured("c1", 1), _measured("c4", 4), _measured("a100-c2", 2, gpu="a100")]
    stages = [
        FitStage("h100 bandwidth", ("c1", "c4"), (("default", "bandwidth"),)),
        FitStage("a100 bandwidth", ("a100-c2",), (("a100", "bandwidth"),)),
    ]
    fitter = StagedFitter(stages, max_evaluations=14)
    result = cross_validate(scenarios, {}, fitter, START)
    assert set(result.predictions) == {"c1", "c4", "a100-c2"}
    # holding out one H100 row leaves the other to recover the truth; its prediction is out-of-sample
    for row in ("c1", "c4"):
        assert result.fold_calibrations[row].default.bandwidth == pytest.approx(0.5, rel=0.1)
        measured = next(s for s in scenarios if s.scenario_id == row).measured
        assert result.predictions[row]["mean_tpot_ms"] == pytest.approx(measured["mean_tpot_ms"], rel=0.1)
    # the only A100 row held out: its stage is skipped, so the A100 has no coefficient of its own
    # and is predicted with the defaults the H100 rows fitted
    assert "bandwidth" not in result.fold_calibrations["a100-c2"].per_gpu.get("a100", {})
    assert result.fold_calibrations["a100-c2"].for_gpu("a100").bandwidth == pytest.approx(0.5, rel=0.1)
    assert result.predictions["a100-c2"] == predict(scenarios[2:], result.fold_calibrations["a100-c2"])["a100-c2"]


def test_stage_results_are_reused_across_folds() -> None:
    scenarios = [_measured("c1", 1), _measured("a100-c2", 2, gpu="a100")]
    stages = [
        FitStage("h100 bandwidth", ("c1",), (("default", "bandwidth"),)),
        FitStage("a100 bandwidth", ("a100-c2",), (("a100", "bandwidth"),)),
    ]
    fitter = StagedFitter(stages, max_evaluations=10)
    fitter.fit(scenarios, START)
    after_full_fit = fitter.simulations
    # holding out the A100 row needs no new fit: the H100 stage saw the same rows from the same start
    fitter.fit(scenarios[:1], START)
    assert fitter.simulations == after_full_fit
