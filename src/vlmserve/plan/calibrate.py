"""Fit the planner's efficiency coefficients to measured runs.

A measured run is a scenario (model, GPU, TP, engine limits, load) plus the figures it
produced. `fit` re-simulates every scenario under candidate coefficients and keeps the
ones that minimise the squared log error over all observations (so 10% off is weighed
the same for a 50 ms TTFT and a 3,000 tok/s throughput). The search is a coordinate
descent over multiplicative steps: no extra dependency, deterministic, and a handful of
coefficients converge in a few dozen simulations.

Inputs come from bench JSON results (`vlmserve bench --json-out`) or, in the benchmark
script, from published measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import COEFFICIENTS, Calibration, Efficiency
from vlmserve.hardware.jsonfile import read_json_file
from vlmserve.hardware.setup import PlanSetup
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.plan.simulate import simulate_run
from vlmserve.results.summary import RunSummary, read_summary
from vlmserve.spec import LoadSpec


@dataclass(frozen=True)
class MetricSpec:
    """Which run figure (results.summary.FIGURES) a published metric is, its scale to the published unit, its family."""

    figure: str
    scale: float
    family: str


METRICS: dict[str, MetricSpec] = {
    "request_throughput": MetricSpec("throughput.requests_per_s", 1.0, "throughput"),
    "output_tok_s": MetricSpec("throughput.output_tokens_per_s", 1.0, "throughput"),
    "total_tok_s": MetricSpec("throughput.total_tokens_per_s", 1.0, "throughput"),
    "mean_ttft_ms": MetricSpec("ttft_ms.mean", 1.0, "ttft"),
    "median_ttft_ms": MetricSpec("ttft_ms.p50", 1.0, "ttft"),
    "p99_ttft_ms": MetricSpec("ttft_ms.p99", 1.0, "ttft"),
    "mean_tpot_ms": MetricSpec("tpot_ms.mean", 1.0, "tpot/itl"),
    "median_tpot_ms": MetricSpec("tpot_ms.p50", 1.0, "tpot/itl"),
    "mean_itl_ms": MetricSpec("itl_ms.mean", 1.0, "tpot/itl"),
    "median_itl_ms": MetricSpec("itl_ms.p50", 1.0, "tpot/itl"),
    "mean_e2e_s": MetricSpec("e2e_ms.mean", 0.001, "e2e"),
}


def metric_value(summary: RunSummary, metric: str) -> float | None:
    """A metric from a run summary, in the unit its name says."""
    spec = METRICS[metric]
    value = summary.figure(spec.figure)
    return None if value is None else value * spec.scale


@dataclass
class Scenario:
    """A deployment and load that was measured; `build` makes its PlanSetup for a calibration."""

    scenario_id: str
    build: Callable[[Calibration], PlanSetup]
    load: LoadSpec
    measured: dict[str, float]
    """metric name → measured value."""
    staggered: bool = False
    """Closed loop in steady state (see `simulate_run`)."""


@dataclass
class FitResult:
    calibration: Calibration
    predictions: dict[str, dict[str, float]] = field(default_factory=dict)
    """scenario id → metric → predicted value."""
    errors_by_family: dict[str, float] = field(default_factory=dict)
    """family → median absolute relative error."""
    evaluations: int = 0


def predict(scenarios: Sequence[Scenario], calibration: Calibration) -> dict[str, dict[str, float]]:
    """Predicted value of every measured metric of every scenario."""
    predictions: dict[str, dict[str, float]] = {}
    for scenario in scenarios:
        output = simulate_run(scenario.build(calibration), scenario.load, staggered=scenario.staggered)
        summary = output.result.summary
        predictions[scenario.scenario_id] = {
            metric: value for metric in scenario.measured if (value := metric_value(summary, metric)) is not None
        }
    return predictions


def relative_errors(scenarios: Sequence[Scenario], predictions: dict[str, dict[str, float]]) -> list[tuple[str, str, float]]:
    """(scenario, metric, predicted/measured − 1) for every pair with both values."""
    rows = []
    for scenario in scenarios:
        for metric, measured in scenario.measured.items():
            predicted = predictions.get(scenario.scenario_id, {}).get(metric)
            if predicted is not None and measured > 0:
                rows.append((scenario.scenario_id, metric, predicted / measured - 1.0))
    return rows


def errors_by_family(rows: Sequence[tuple[str, str, float]]) -> dict[str, float]:
    """Median absolute relative error per metric family."""
    families: dict[str, list[float]] = {}
    for _scenario, metric, error in rows:
        families.setdefault(METRICS[metric].family, []).append(abs(error))
    return {family: median(values) for family, values in sorted(families.items())}


def _loss(rows: Sequence[tuple[str, str, float]]) -> float:
    return sum(math.log(max(1.0 + error, 1e-6)) ** 2 for _s, _m, error in rows) / max(len(rows), 1)


def _with(calibration: Calibration, target: str, coefficient: str, value: float) -> Calibration:
    per_gpu = {key: dict(values) for key, values in calibration.per_gpu.items()}
    default = calibration.default
    if target == "default":
        default = default.with_values(**{coefficient: value})
    else:
        per_gpu.setdefault(target, {})[coefficient] = value
    return Calibration(default, per_gpu, calibration.source, dict(calibration.fit_error))


def _current(calibration: Calibration, target: str, coefficient: str) -> float:
    efficiency = calibration.default if target == "default" else calibration.for_gpu(target)
    return float(getattr(efficiency, coefficient))


BOUNDS: dict[str, tuple[float, float]] = {
    # Physically plausible ranges: a fit may not explain data with impossible efficiencies.
    "bandwidth": (0.3, 0.9),
    "compute": (0.1, 0.8),
    "interconnect": (0.1, 1.0),
    "moe_expert_spread": (0.05, 1.0),
    "moe_efficiency": (0.1, 1.0),
    "step_overhead_s": (0.0, 0.01),
    "per_seq_overhead_s": (0.0, 0.00005),
    "allreduce_latency_s": (0.0, 0.0002),
    "request_overhead_s": (0.0, 0.1),
    "frontend_token_s": (0.0, 0.0005),
    "frontend_request_s": (0.0, 0.05),
    "reserved_memory_gb": (0.5, 10.0),
}


def _clip(coefficient: str, value: float) -> float:
    low, high = BOUNDS.get(coefficient, (0.0, math.inf))
    return min(max(value, low), high)


def fit(
    scenarios: Sequence[Scenario],
    start: Calibration,
    parameters: Sequence[tuple[str, str]],
    *,
    max_evaluations: int = 160,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Nelder–Mead over log(coefficients), clipped to `BOUNDS`; target is 'default' or a GPU key.

    Log space makes a 10% step mean the same for a 2 ms overhead and a 0.7 efficiency, and
    the simplex moves coupled coefficients (e.g. expert spread and MoE efficiency) together,
    which one-at-a-time search cannot. Candidates that make a scenario impossible (the
    model no longer fits) score as infinitely bad.
    """
    for _target, coefficient in parameters:
        if coefficient not in COEFFICIENTS:
            raise UserError(f"unknown coefficient '{coefficient}'; known: {', '.join(COEFFICIENTS)}")
    if not scenarios:
        raise UserError("nothing to fit: no measured scenario")
    cache: dict[tuple[float, ...], tuple[float, Calibration, dict[str, dict[str, float]]]] = {}

    def calibration_at(point: Sequence[float]) -> Calibration:
        calibration = start
        for (target, coefficient), log_value in zip(parameters, point):
            calibration = _with(calibration, target, coefficient, _clip(coefficient, math.exp(log_value)))
        return calibration

    def score(point: Sequence[float]) -> float:
        key = tuple(round(value, 9) for value in point)
        if key not in cache:
            calibration = calibration_at(point)
            try:
                predictions = predict(scenarios, calibration)
                loss = _loss(relative_errors(scenarios, predictions))
            except UserError:
                predictions, loss = {}, math.inf
            cache[key] = (loss, calibration, predictions)
        return cache[key][0]

    origin = [math.log(max(_current(start, target, coefficient), 1e-5)) for target, coefficient in parameters]
    simplex = [origin] + [
        [value + (0.4 if index == axis else 0.0) for index, value in enumerate(origin)] for axis in range(len(origin))
    ]
    scores = [score(point) for point in simplex]
    while len(cache) < max_evaluations:
        order = sorted(range(len(simplex)), key=lambda index: scores[index])
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        if progress:
            progress(f"{len(cache)} simulations, loss {scores[0]:.4f}")
        if scores[-1] - scores[0] < 1e-5:
            break
        centroid = [sum(column) / (len(simplex) - 1) for column in zip(*simplex[:-1])]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        reflected_score = score(reflected)
        if reflected_score < scores[0]:
            expanded = [c + 2.0 * (c - w) for c, w in zip(centroid, worst)]
            expanded_score = score(expanded)
            simplex[-1], scores[-1] = (
                (expanded, expanded_score) if expanded_score < reflected_score else (reflected, reflected_score)
            )
        elif reflected_score < scores[-2]:
            simplex[-1], scores[-1] = reflected, reflected_score
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            contracted_score = score(contracted)
            if contracted_score < scores[-1]:
                simplex[-1], scores[-1] = contracted, contracted_score
            else:  # shrink towards the best point
                best_point = simplex[0]
                simplex = [best_point] + [[b + 0.5 * (p - b) for b, p in zip(best_point, point)] for point in simplex[1:]]
                scores = [scores[0]] + [score(point) for point in simplex[1:]]
    best_index = min(range(len(simplex)), key=lambda index: scores[index])
    _loss_value, best, best_predictions = cache[tuple(round(value, 9) for value in simplex[best_index])]
    rows = relative_errors(scenarios, best_predictions)
    return FitResult(best, best_predictions, errors_by_family(rows), len(cache))


# ---- bench results as scenarios -----------------------------------------------------------------


def scenario_from_bench_json(
    path: str | Path, *, gpu: str, model: str | None = None, tp: int | None = None, replicas: int | None = None
) -> Scenario:
    """A measured bench result (the --json-out document) as a calibration scenario."""
    file_path = Path(path)
    data = read_json_file(file_path, "run file", "give `vlmserve bench --json-out` results")
    meta = data.get("meta") if isinstance(data, dict) else None
    load_spec = meta.get("load_spec") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(load_spec, dict):
        raise UserError(f"{file_path}: no meta.load_spec in it; give a `vlmserve bench --json-out` result")
    if meta.get("simulated"):
        raise UserError(f"{file_path}: is a simulated run; calibrate from measured runs only")
    deployment = _section(meta.get("deployment"))
    engine_args = _section(deployment.get("engine_args"))
    model_name = model or meta.get("model") or deployment.get("model")
    if not model_name:
        raise UserError(f"{file_path}: names no model; pass --model NAME|config.json")
    load_fields = {key: value for key, value in load_spec.items() if key in LoadSpec.model_fields}
    try:
        load = LoadSpec.model_validate(load_fields)
    except Exception as err:  # pydantic ValidationError; one line is enough here
        raise UserError(f"{file_path}: its meta.load_spec is not a valid load spec ({str(err).splitlines()[0]})") from None
    summary = read_summary(data, str(file_path))
    measured = {metric: value for metric in METRICS if (value := metric_value(summary, metric)) is not None}
    tp_value = tp or _whole(file_path, "engine_args.tensor_parallel_size", engine_args.get("tensor_parallel_size")) or 1
    replicas_value = replicas or _whole(file_path, "replicas", deployment.get("replicas")) or 1
    limits = {
        key: value
        for key in ("max_num_seqs", "max_num_batched_tokens")
        if (value := _whole(file_path, f"engine_args.{key}", engine_args.get(key)))
    }

    def build(calibration: Calibration) -> PlanSetup:
        return PlanSetup.from_names(str(model_name), gpu, tp=tp_value, replicas=replicas_value, calibration=calibration, **limits)

    build(Calibration())  # fail now, in one line, if the model or GPU is unknown or does not fit
    return Scenario(file_path.stem, build, load, measured)


def _section(value: JSONValue) -> JSONObject:
    """A block of a run's meta (deployment, engine_args); absent, or not an object, reads as empty."""
    return value if isinstance(value, dict) else {}


def _whole(file_path: Path, name: str, value: JSONValue) -> int | None:
    """A count in a run's meta.deployment as an int; None when unset or 0; one line when it is not a number."""
    if not value:
        return None
    if isinstance(value, (int, float, str)):
        try:
            return int(value)
        except ValueError:
            pass
    raise UserError(f"{file_path}: meta.deployment.{name} is {value!r}, not a whole number")


DEFAULT_FIT_PARAMETERS = ("bandwidth", "compute", "step_overhead_s")


def calibrate_runs(
    paths: Sequence[str],
    *,
    gpu: str,
    model: str | None,
    start: Calibration,
    parameters: Sequence[str] = DEFAULT_FIT_PARAMETERS,
    progress: Callable[[str], None] | None = None,
) -> tuple[FitResult, list[Scenario]]:
    """Fit per-GPU coefficients for `gpu` from bench results."""
    from vlmserve.hardware.gpus import get_gpu

    gpu_key = get_gpu(gpu).key
    scenarios = [scenario_from_bench_json(path, gpu=gpu, model=model) for path in paths]
    result = fit(scenarios, start, [(gpu_key, name) for name in parameters], progress=progress)
    result.calibration.source = f"fitted by `vlmserve plan calibrate` on {len(scenarios)} run(s) for {gpu_key}"
    result.calibration.fit_error = {family: round(error, 4) for family, error in result.errors_by_family.items()}
    return result, scenarios


def efficiency_table(efficiency: Efficiency) -> dict[str, float]:
    return {name: getattr(efficiency, name) for name in COEFFICIENTS}
