"""The planner against published vLLM measurements: held-out error by source, shape checks, speed.

Usage:
    .venv/bin/python benchmarks/plan_vs_published.py             # evaluate the shipped calibration
    .venv/bin/python benchmarks/plan_vs_published.py --refit     # refit on the calibration sources, save, evaluate
    .venv/bin/python benchmarks/plan_vs_published.py --markdown out.md --skip-shapes --skip-speed
    .venv/bin/python benchmarks/plan_vs_published.py --smoke     # seconds: a few runs, shapes and speed, tiny

The reference is benchmarks/data/published_vllm.csv (see benchmarks/data/README.md): one row per
published figure, each run tied to a `source` (one publication) and each source wholly on one side
of the `split`. `--refit` fits the planner's coefficients on calibration sources only; the figures
quoted against the targets are the errors on validation sources, which no fit ever sees. The
calibration sources' own errors are printed too, labelled in-sample. A run the planner cannot price
(unknown model, GPU or dtype, a flag it cannot express, or a deployment it judges impossible) is
listed as refused with the planner's one-line reason, never dropped. Workload details a source
leaves out are written next to the run as ASSUMED. All planner figures are simulated, not measured.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _smoke import parse_args  # noqa: E402

from vlmserve.errors import UserError  # noqa: E402
from vlmserve.hardware.calibration import Calibration, Efficiency, default_calibration  # noqa: E402
from vlmserve.hardware.gpus import get_gpu  # noqa: E402
from vlmserve.hardware.models import ModelCost, load_model, parse_config  # noqa: E402
from vlmserve.hardware.setup import PlanSetup  # noqa: E402
from vlmserve.plan.calibrate import METRICS, Scenario, fit, metric_value  # noqa: E402
from vlmserve.plan.simulate import simulate_run  # noqa: E402
from vlmserve.spec import LoadSpec  # noqa: E402

PUBLISHED = Path(os.environ.get("VLMSERVE_PUBLISHED_CSV", ROOT / "benchmarks/data/published_vllm.csv"))
"""The reference measurements; the variable points the script at another file of the same columns."""
CALIBRATION_OUT = ROOT / "src/vlmserve/hardware/data/calibration.json"
CALIBRATION, VALIDATION = "calibration", "validation"
TARGETS = {"throughput": 0.10, "tpot/itl": 0.15, "ttft": 0.20}
"""Issue #41's targets for the median absolute error on validation sources."""


# ---- the reference: one Run per published measured run ----------------------------------------------


@dataclass
class Run:
    """One measured run of the reference file: its workload (shared by its rows) and its figures."""

    run_id: str
    info: dict[str, str]
    measured: dict[str, float] = field(default_factory=dict)
    """metric → published value, for the metrics the planner reports."""
    unexpressible: list[str] = field(default_factory=list)
    """Metrics published for this run that the planner does not report."""

    @property
    def source(self) -> str:
        return self.info["source"]

    @property
    def split(self) -> str:
        return self.info["split"]

    @property
    def gpu(self) -> str:
        return self.info["gpu"]


REQUIRED_COLUMNS = ("id", "source", "split", "planner_model", "gpu", "tp", "metric", "value")


def read_runs(path: Path) -> list[Run]:
    """The reference file as runs, checking that every source sits wholly on one side of the split."""
    if not path.is_file():
        raise UserError(f"{path} not found: the reference lives in benchmarks/data/ (or set VLMSERVE_PUBLISHED_CSV)")
    runs: dict[str, Run] = {}
    side: dict[str, str] = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [name for name in REQUIRED_COLUMNS if name not in (reader.fieldnames or [])]
        if missing:
            raise UserError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            if row["split"] not in (CALIBRATION, VALIDATION):
                raise UserError(f"{path}:{line}: split must be '{CALIBRATION}' or '{VALIDATION}', not {row['split']!r}")
            if side.setdefault(row["source"], row["split"]) != row["split"]:
                raise UserError(f"{path}:{line}: source {row['source']!r} is on both sides of the split")
            run = runs.setdefault(row["id"], Run(row["id"], row))
            try:
                value = float(row["value"])
            except ValueError:
                raise UserError(f"{path}:{line}: value {row['value']!r} is not a number") from None
            if row["metric"] in METRICS:
                run.measured[row["metric"]] = value
            else:
                run.unexpressible.append(row["metric"])
    return list(runs.values())


# ---- a published run as a planner scenario ----------------------------------------------------------


@dataclass
class Workload:
    """What the planner simulates for a run, and what had to be assumed to get there."""

    load: LoadSpec
    staggered: bool
    assumed: list[str]


LEGACY_WORKLOADS: dict[str, Workload] = {
    # The shared reference's rows whose lengths the sources leave out: the assumptions of the
    # earlier comparison, unchanged (they are ASSUMED in the file too).
    **{
        f"spark-oss-c{c}": Workload(
            LoadSpec(input_len=1000, output_len=128, concurrency=c, num_requests=10 * c),
            True,
            [
                "lengths 1000/128 as the source infers",
                "10×concurrency prompts",
                "gpu-memory-utilization 0.8",
                "KV cache FP8 as published",
            ],
        )
        for c in (1, 4, 16, 64)
    },
    "h100-oss-tp1": Workload(
        LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=1000, num_requests=1000),
        False,
        ["ShareGPT lengths: the planner's built-in distribution"],
    ),
    "h100-oss-tp2": Workload(
        LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=1000, num_requests=1000),
        False,
        ["ShareGPT lengths: the planner's built-in distribution"],
    ),
    "h100-oss-tp4": Workload(
        LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=1000, num_requests=1000),
        False,
        ["ShareGPT lengths: the planner's built-in distribution"],
    ),
    "h100-qwen3-8b-c4": Workload(
        LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=4, num_requests=100),
        True,
        ["ShareGPT lengths: the planner's built-in distribution"],
    ),
    "h100-llama3-8b": Workload(
        LoadSpec(input_len=1024, output_len=128, concurrency=1, num_requests=10),
        True,
        ["input/output 1024/128 (vllm bench random defaults; the source gives none)"],
    ),
    "l4x4-qwen3-4b": Workload(
        LoadSpec(input_len=1024, output_len=200, concurrency=32, num_requests=320),
        True,
        [
            "input 1024 (the source gives none)",
            "output 200, inferred from the row: 32/5.6 req/s = 5.7 s per request = TTFT + 199×TPOT",
            "10×concurrency prompts",
        ],
    ),
}
LEGACY_SETUP: dict[str, dict[str, Any]] = {
    **{f"spark-oss-c{c}": {"kv_dtype": "fp8", "gpu_memory_utilization": 0.8} for c in (1, 4, 16, 64)},
    "h100-oss-tp2": {"async_scheduling": True},
}


def _number(text: str) -> float | None:
    try:
        return float(text.replace("~", ""))
    except (TypeError, ValueError):
        return None


def workload_for(run: Run, scale: float) -> Workload:
    """The load a run's columns describe; what they leave out is assumed and said so."""
    if run.run_id in LEGACY_WORKLOADS:
        legacy = LEGACY_WORKLOADS[run.run_id]
        if scale < 1.0 and legacy.load.num_requests:
            return Workload(
                legacy.load.model_copy(update={"num_requests": max(4, int(legacy.load.num_requests * scale))}),
                legacy.staggered,
                legacy.assumed,
            )
        return legacy
    info = run.info
    assumed = [part.strip() for part in info.get("assumed", "").split(";") if part.strip()]
    prompts = int(_number(info.get("num_prompts", "")) or 0)
    concurrency = int(_number(info.get("max_concurrency", "")) or 0)
    if not prompts:
        prompts = 20 * concurrency if concurrency else 100
    if scale < 1.0:
        prompts = max(4, int(prompts * scale))
    closed_loop = 0 < concurrency < prompts
    users = concurrency if closed_loop else prompts
    dataset = info.get("dataset", "").lower()
    if dataset.startswith("sharegpt"):
        load = LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=users, num_requests=prompts)
    else:
        input_len = _number(info.get("input_len", ""))
        output_len = _number(info.get("output_len", ""))
        if input_len is None or output_len is None:
            raise UserError("input/output lengths not published and no assumption recorded for this run")
        load = LoadSpec(
            input_len=max(1, round(input_len)), output_len=max(1, round(output_len)), concurrency=users, num_requests=prompts
        )
    # Every non-legacy row was measured with `vllm bench serve`, which creates one task per prompt at
    # once and lets --max-concurrency of them through a semaphore (vllm/benchmarks/serve.py:
    # `benchmark` and `limited_request_func`): the first wave starts together, as simulated here.
    return Workload(load, False, assumed)


UNEXPRESSIBLE_FLAGS = {
    "--speculative-config": "speculative decoding is not expressible in the planner",
    "-pp": "pipeline parallelism is not expressible in the planner",
    "--pipeline-parallel-size": "pipeline parallelism is not expressible in the planner",
}
WEIGHT_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int4": "int4", "mxfp4": None, "nvfp4": "nvfp4"}
"""The file's weight formats as the planner's --weight-dtype (None: the checkpoint's own format)."""


def engine_options(run: Run) -> dict[str, Any]:
    """PlanSetup options from the run's `vllm serve` flags and columns; a flag it cannot express refuses the run."""
    flags = run.info.get("flags", "")
    for flag, reason in UNEXPRESSIBLE_FLAGS.items():
        if re.search(rf"(^|\s){re.escape(flag)}(\s|=|$)", flags):
            raise UserError(reason)
    options: dict[str, Any] = dict(LEGACY_SETUP.get(run.run_id, {}))

    def value(flag: str) -> str | None:
        match = re.search(rf"{re.escape(flag)}[ =]([^\s]+)", flags)
        return match.group(1) if match else None

    for flag, name, kind in (
        ("--max-num-seqs", "max_num_seqs", int),
        ("--max-num-batched-tokens", "max_num_batched_tokens", int),
        ("--max-model-len", "max_model_len", int),
        ("--gpu-memory-utilization", "gpu_memory_utilization", float),
    ):
        text = value(flag)
        if text is not None:
            options[name] = kind(text)
    if "--async-scheduling" in flags:
        options["async_scheduling"] = True
    if "--no-enable-prefix-caching" in flags:
        options["enable_prefix_caching"] = False
    kv = run.info.get("kv_dtype", "")
    if kv.startswith("fp8") or value("--kv-cache-dtype") in ("fp8", "fp8_e4m3"):
        options["kv_dtype"] = "fp8"
    weight = run.info.get("weight_dtype", "").strip().lower()
    if weight in WEIGHT_DTYPES and WEIGHT_DTYPES[weight] is not None and run.run_id not in LEGACY_SETUP:
        options["weight_dtype"] = WEIGHT_DTYPES[weight]
    version = re.search(r"\d+\.\d+(\.\d+)?", run.info.get("vllm_version", ""))
    if version and "vllm_version" in {item.name for item in fields(PlanSetup)}:
        options["vllm_version"] = version.group(0)  # the kernel tables closest to the run's vLLM
    if run.info.get("expert_parallel") == "yes":
        if "ep" not in {item.name for item in fields(PlanSetup)}:
            raise UserError("expert parallelism (--enable-expert-parallel) is not expressible in the planner")
        options["ep"] = int(run.info["tp"]) * int(_number(value("--data-parallel-size") or "1") or 1)
    return options


def _aiconfigurator_config(name: str) -> Path | None:
    """The config.json copy aiconfigurator-core ships for a Hugging Face model name, if it is installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model_configs" / f"{name.replace('/', '--')}_config.json"
    return path if path.is_file() else None


def resolve_model(name: str) -> ModelCost:
    """A preset, else the config.json aiconfigurator-core ships for the name, else the planner's own refusal."""
    try:
        return load_model(name)
    except UserError as preset_error:
        path = _aiconfigurator_config(name)
        if path is None:
            raise UserError(f"{preset_error} (and aiconfigurator-core ships no config for it)") from None
        return parse_config(json.loads(path.read_text()), name=name, source=str(path))


def gpu_name(published: str) -> str:
    """The GPU as the planner looks it up: the published name without its parenthetical."""
    return published.split(" (")[0].strip()


@dataclass
class Case:
    """A run the planner can be asked about: its scenario and its assumptions."""

    run: Run
    scenario: Scenario
    assumed: list[str]


def build_cases(runs: Sequence[Run], scale: float) -> tuple[list[Case], dict[str, str]]:
    """Scenarios for the runs the planner can express; the rest with the planner's one-line reason."""
    cases: list[Case] = []
    refused: dict[str, str] = {}
    for run in runs:
        if not run.measured:
            refused[run.run_id] = f"no metric the planner reports ({', '.join(sorted(set(run.unexpressible)))})"
            continue
        try:
            model = resolve_model(run.info["planner_model"])
            gpu = get_gpu(gpu_name(run.gpu))
            options = engine_options(run)
            tp = int(run.info["tp"])
            workload = workload_for(run, scale)
            if "image" in run.info.get("dataset", "").lower() and model.vision is None:
                raise UserError(f"{model.name} has no vision tower in its config")
        except UserError as err:
            refused[run.run_id] = str(err)
            continue

        def build(
            calibration: Calibration, model: ModelCost = model, gpu: Any = gpu, tp: int = tp, options: dict[str, Any] = options
        ) -> PlanSetup:
            return PlanSetup(model=model, gpu=gpu, tp=tp, calibration=calibration, **options)

        scenario = Scenario(run.run_id, build, workload.load, dict(run.measured), staggered=workload.staggered)
        cases.append(Case(run, scenario, workload.assumed))
    return cases, refused


def predict_each(cases: Sequence[Case], calibration: Calibration) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Every case's predicted metrics; a case the planner refuses under this calibration is returned apart."""
    predictions: dict[str, dict[str, float]] = {}
    refused: dict[str, str] = {}
    for case in cases:
        scenario = case.scenario
        try:
            summary = simulate_run(scenario.build(calibration), scenario.load, staggered=scenario.staggered).result.summary
        except UserError as err:
            refused[scenario.scenario_id] = str(err)
            continue
        predictions[scenario.scenario_id] = {
            metric: value for metric in scenario.measured if (value := metric_value(summary, metric)) is not None
        }
    return predictions, refused


# ---- fitting on the calibration sources --------------------------------------------------------------


PRIOR = Calibration(
    Efficiency(
        # Not fitted: memory-bound kernels reach roughly 90 % of datasheet HBM bandwidth in copy
        # benchmarks; serving rows cannot pin it better.
        bandwidth=0.9,
        step_overhead_s=0.0015,
        # Not fitted: the engine process's own Python per scheduled request (schedule(), input
        # preparation, update_from_output) — microseconds each; the API server's larger per-stream
        # cost is `frontend_token_s`, fitted below. An order-of-magnitude prior, not a measurement.
        per_seq_overhead_s=1e-5,
        # starting points of the fit (overwritten by it): MoE kernels slower than dense, skewed routing;
        # the API server's CPU per streamed token and per request (see Efficiency)
        moe_efficiency=0.5,
        moe_expert_spread=0.5,
        reserved_memory_gb=3.0,
        frontend_token_s=5e-5,
        frontend_request_s=2e-3,
    ),
    per_gpu={
        # PCIe GPUs: vLLM's custom all-reduce needs NVLink, so NCCL over PCIe pays tens of µs a call.
        "l4": {"allreduce_latency_s": 4e-5},
        "l40s": {"allreduce_latency_s": 4e-5},
        # Blackwell runs MXFP4 natively: its MoE kernels are taken to be as efficient as dense ones.
        "gb10": {"moe_efficiency": 1.0, "moe_expert_spread": 0.5},
    },
    source="prior",
)


@dataclass(frozen=True)
class Stage:
    """One step of the fit: which calibration runs it uses (a rule, not a list) and what it moves."""

    title: str
    selects: Callable[[Case], bool]
    parameters: tuple[tuple[str, str], ...]


def _is_moe(case: Case) -> bool:
    return case.scenario.build(PRIOR).model.is_moe


REFERENCE_GPU = "h100"
"""The default coefficients are fitted on this GPU's runs; every other GPU with calibration runs gets its own."""


def fit_stages(cases: Sequence[Case]) -> list[Stage]:
    """The staged fit, derived from what the calibration sources contain (coefficients the planner still has)."""
    known = {item.name for item in fields(Efficiency)}
    stages = [
        Stage(
            "dense compute on the reference GPU",
            lambda case: not _is_moe(case) and _gpu_key(case) == REFERENCE_GPU,
            (("default", "compute"),),
        ),
        Stage(
            "MoE kernels and routing spread on the reference GPU",
            lambda case: _is_moe(case) and _gpu_key(case) == REFERENCE_GPU,
            (("default", "moe_efficiency"), ("default", "moe_expert_spread")),
        ),
        # The CPU side, in two stages on the runs where each part shows (the compute and MoE
        # coefficients above only reach roofline-priced ops). With a few streams the API server is
        # idle most of the time: the engine's per-step CPU (TPOT above the kernels) and the
        # per-request latency outside the engine (TTFT above the prefill) are what is left.
        Stage(
            "engine overheads at low concurrency on the reference GPU",
            lambda case: _gpu_key(case) == REFERENCE_GPU and _few_streams(case),
            (("default", "step_overhead_s"), ("default", "request_overhead_s")),
        ),
        # A burst of hundreds of requests at once: vLLM's single API server process streams every
        # token and admits every request, and bounds the steps when it has more to do than the GPU.
        Stage(
            "API server under bursts on the reference GPU",
            lambda case: _gpu_key(case) == REFERENCE_GPU and _burst(case),
            (("default", "frontend_token_s"), ("default", "frontend_request_s")),
        ),
    ]
    for gpu in sorted({_gpu_key(case) for case in cases} - {REFERENCE_GPU}):
        stages.append(Stage(f"compute on {gpu}", _on_gpu(gpu), ((gpu, "compute"),)))
    return [stage for stage in stages if all(name in known for _target, name in stage.parameters)]


FEW_STREAMS = 8
"""Closed-loop runs with at most this many clients identify the engine's own overheads."""


def _few_streams(case: Case) -> bool:
    load = case.scenario.load
    return load.rate is None and 0 < (load.concurrency or 0) <= FEW_STREAMS


def _burst(case: Case) -> bool:
    """Every prompt sent at once (no concurrency limit): `vllm bench serve`'s default request rate inf."""
    load = case.scenario.load
    return load.rate is None and (load.concurrency or 0) >= (load.num_requests or 0) > FEW_STREAMS


def _gpu_key(case: Case) -> str:
    return case.scenario.build(PRIOR).gpu.key


def _on_gpu(gpu: str) -> Callable[[Case], bool]:
    return lambda case: _gpu_key(case) == gpu


FIT_EVALUATIONS = 20
"""Simulations per stage (Nelder–Mead over one or two coefficients; the errors here are far above its ~2 % residual)."""
FIT_RUNS_PER_STAGE = 4
"""At most this many runs per stage (every k-th by id): keeps a refit to a few minutes of CPU."""


def refit(cases: Sequence[Case], progress: Callable[[str], None]) -> tuple[Calibration, list[str]]:
    """Fit on calibration runs only, stage after stage; the lines say what each stage used."""
    calibration_cases = [case for case in cases if case.run.split == CALIBRATION]
    _, refused = predict_each(calibration_cases, PRIOR)
    usable = [case for case in calibration_cases if case.scenario.scenario_id not in refused]
    calibration = PRIOR
    notes: list[str] = []
    for stage in fit_stages(usable):
        chosen = sorted((case for case in usable if stage.selects(case)), key=lambda case: case.scenario.scenario_id)
        if len(chosen) > FIT_RUNS_PER_STAGE:
            step = len(chosen) / FIT_RUNS_PER_STAGE
            chosen = [chosen[int(index * step)] for index in range(FIT_RUNS_PER_STAGE)]
        if not chosen:
            notes.append(f"- {stage.title}: no calibration run; left at the prior")
            continue
        progress(f"stage '{stage.title}' on {len(chosen)} runs")
        result = fit([case.scenario for case in chosen], calibration, stage.parameters, max_evaluations=FIT_EVALUATIONS)
        calibration = result.calibration
        values = ", ".join(
            f"{name} ({target}) = {getattr(calibration.default if target == 'default' else calibration.for_gpu(target), name):.4g}"
            for target, name in stage.parameters
        )
        notes.append(f"- {stage.title}: {values}, on {', '.join(case.scenario.scenario_id for case in chosen)}")
    calibration.source = (
        "fitted by benchmarks/plan_vs_published.py --refit on the calibration sources of "
        "benchmarks/data/published_vllm.csv only; quote its errors on the validation sources"
    )
    return calibration, notes


# ---- errors and their tables ----------------------------------------------------------------------


@dataclass(frozen=True)
class Error:
    """One published figure against its prediction."""

    case: Case
    metric: str
    measured: float
    predicted: float

    @property
    def relative(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def family(self) -> str:
        return METRICS[self.metric].family


FAMILIES = ("throughput", "ttft", "tpot/itl", "e2e", "goodput")


def errors_of(cases: Sequence[Case], predictions: dict[str, dict[str, float]]) -> list[Error]:
    rows = []
    for case in cases:
        for metric, measured in case.scenario.measured.items():
            predicted = predictions.get(case.scenario.scenario_id, {}).get(metric)
            if predicted is not None and measured > 0:
                rows.append(Error(case, metric, measured, predicted))
    return rows


def _median_abs(rows: Sequence[Error]) -> float | None:
    return median(abs(row.relative) for row in rows) if rows else None


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def summary_table(rows: Sequence[Error], label: str, with_targets: bool) -> list[str]:
    """Median absolute error per metric family (and the worst), over the given rows."""
    header = f"| metric family | figures | runs | sources | {label} median abs error | worst |"
    rule = "|---|---:|---:|---:|---:|---:|"
    if with_targets:
        header += " target |"
        rule += "---|"
    lines = [header, rule]
    for family in FAMILIES:
        group = [row for row in rows if row.family == family]
        if not group and family != "goodput":
            continue
        worst = max((abs(row.relative) for row in group), default=None)
        runs = {row.case.run.run_id for row in group}
        sources = {row.case.run.source for row in group}
        value = _median_abs(group)
        cell = f"**{_pct(value)}**" if with_targets and value is not None else _pct(value)
        line = f"| {family} | {len(group)} | {len(runs)} | {len(sources)} | {cell} | {_pct(worst)} |"
        if with_targets:
            target = TARGETS.get(family)
            if target is None:
                verdict = "–" if group else "no published figure"
            else:
                verdict = f"≤ {target:.0%}: " + ("met" if value is not None and value <= target else "MISSED")
            line += f" {verdict} |"
        lines.append(line)
    return lines


def per_gpu_table(rows: Sequence[Error]) -> list[str]:
    gpus = sorted({row.case.run.gpu for row in rows})
    families = [family for family in FAMILIES if any(row.family == family for row in rows)]
    lines = ["| GPU | runs | " + " | ".join(families) + " |", "|---|---:|" + "---:|" * len(families)]
    for gpu in gpus:
        group = [row for row in rows if row.case.run.gpu == gpu]
        cells = [_pct(_median_abs([row for row in group if row.family == family])) for family in families]
        lines.append(f"| {gpu} | {len({row.case.run.run_id for row in group})} | " + " | ".join(cells) + " |")
    return lines


def worst_table(rows: Sequence[Error], count: int) -> list[str]:
    lines = ["| run | source | metric | published | planner | error |", "|---|---|---|---:|---:|---:|"]
    for row in sorted(rows, key=lambda row: -abs(row.relative))[:count]:
        lines.append(
            f"| {row.case.run.run_id} | {row.case.run.source} | {row.metric} | {row.measured:.4g} | "
            f"{row.predicted:.4g} | {row.relative:+.0%} |"
        )
    return lines


def all_rows_table(rows: Sequence[Error]) -> list[str]:
    lines = ["| split | run | metric | published | planner | error |", "|---|---|---|---:|---:|---:|"]
    for row in sorted(rows, key=lambda row: (row.case.run.split != VALIDATION, row.case.run.run_id, row.metric)):
        lines.append(
            f"| {row.case.run.split} | {row.case.run.run_id} | {row.metric} | {row.measured:.4g} | "
            f"{row.predicted:.4g} | {row.relative:+.0%} |"
        )
    return lines


def scaled(requests: int, scale: float) -> int:
    """A request count shrunk for --smoke (`scale` < 1), never below a handful."""
    return max(8, int(requests * scale))


def shape_replicas_vs_tp(calibration: Calibration, scale: float = 1.0) -> list[str]:
    """Llama-3.1-8B (fits one H100): N TP1 replicas vs one TPN server on the same N GPUs, same heavy load."""
    lines = ["| GPUs | deployment | output tok/s | mean TTFT ms | mean TPOT ms |", "|---:|---|---:|---:|---:|"]
    ratios = []
    for gpus in (2, 4):
        load = LoadSpec(
            dataset="sharegpt", dataset_path="builtin", concurrency=256 * gpus, num_requests=scaled(1000 * gpus, scale)
        )
        results = {}
        for label, tp, replicas in ((f"{gpus} replicas × TP1", 1, gpus), (f"1 replica × TP{gpus}", gpus, 1)):
            setup = PlanSetup.from_names("llama-3.1-8b", "h100", tp=tp, replicas=replicas, calibration=calibration)
            summary = simulate_run(setup, load).result.summary
            results[tp] = summary.throughput.output_tokens_per_s
            lines.append(f"| {gpus} | {label} | {results[tp]:.0f} | {summary.ttft_ms.mean:.0f} | {summary.tpot_ms.mean:.1f} |")
        ratios.append((gpus, results[1] / results[gpus]))
    lines.append("")
    for gpus, ratio in ratios:
        lines.append(
            f"On {gpus} GPUs, independent replicas give {ratio:.2f}× the output throughput of one TP{gpus} "
            f"server ({'reproduces' if ratio > 1 else 'does NOT reproduce'} the published finding)."
        )
    return lines


def shape_knee(calibration: Calibration, scale: float = 1.0) -> list[str]:
    """Llama-3.1-8B on one H100, open loop at rising rates: throughput flattens, TTFT climbs."""
    lines = ["| offered rate req/s | achieved req/s | output tok/s | mean TTFT ms | p99 TTFT ms |", "|---:|---:|---:|---:|---:|"]
    setup = PlanSetup.from_names("llama-3.1-8b", "h100", calibration=calibration)
    for rate in (4, 8, 16, 24, 32, 40, 48, 64):
        load = LoadSpec(input_len=1024, output_len=256, rate=float(rate), num_requests=scaled(max(400, rate * 30), scale))
        summary = simulate_run(setup, load, record_token_times=True).result.summary
        lines.append(
            f"| {rate} | {summary.throughput.requests_per_s:.1f} | "
            f"{summary.throughput.output_tokens_per_s:.0f} | {summary.ttft_ms.mean:.0f} | "
            f"{summary.ttft_ms.p99:.0f} |"
        )
    return lines


def speed(calibration: Calibration, scale: float = 1.0) -> list[str]:
    setup = PlanSetup.from_names("llama-3.1-8b", "h100", calibration=calibration)
    load = LoadSpec(input_len=1024, output_len=128, concurrency=64, num_requests=scaled(2000, scale))
    walls, cpus = [], []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        simulate_run(setup, load)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    lines = [
        f"- one configuration, {load.num_requests:,} requests (Llama-3.1-8B, H100, 1024/128, concurrency 64): "
        f"best of 3 {min(walls):.2f} s wall, {min(cpus):.2f} s CPU (one process, one core)"
    ]
    from vlmserve.plan.search import SearchSpace, run_search
    from vlmserve.spec import SLO

    space = SearchSpace(
        model="llama-3.1-8b",
        gpus=["h100", "h200", "l40s", "a100"] if scale == 1.0 else ["h100"],
        tps=[1, 2, 4],
        replicas=[1, 2, 3, 4],
        max_num_seqs=[64, 128, 256],
        max_gpus=8,
    )
    load = LoadSpec(input_len=1024, output_len=128, rate=20.0, num_requests=scaled(300, scale))
    slo = SLO.parse("ttft_p95=1s,tpot_p95=60ms")
    for prune in (True, False):
        wall, cpu = time.perf_counter(), time.process_time()
        outcome = run_search(
            space, load, slo, prices={"h100": 3.0, "h200": 4.0, "l40s": 1.2, "a100": 2.0}, calibration=calibration, prune=prune
        )
        lines.append(
            f"- search {'with' if prune else 'without'} pruning: {outcome.evaluated} configurations, "
            f"{outcome.simulated} simulated ({load.num_requests} requests each), {time.perf_counter() - wall:.1f} s wall, "
            f"{time.process_time() - cpu:.1f} s CPU; best: {outcome.best.label if outcome.best else 'none'}"
        )
    return lines


def smoke_runs(runs: Sequence[Run]) -> list[Run]:
    """A handful of small runs from both sides of the split (for --smoke)."""
    calibration = [run for run in runs if run.split == CALIBRATION and run.run_id.startswith("gps-qwen3-8b")]
    validation = [run for run in runs if run.split == VALIDATION and run.run_id in LEGACY_WORKLOADS]
    return calibration[:2] + validation[:2]


def report(
    cases: Sequence[Case],
    refused: dict[str, str],
    predictions: dict[str, dict[str, float]],
    calibration: Calibration,
    fit_notes: Sequence[str],
    timings: Sequence[str],
    runs: Sequence[Run],
    full_table: bool,
) -> list[str]:
    rows = errors_of(cases, predictions)
    held_out = [row for row in rows if row.case.run.split == VALIDATION]
    in_sample = [row for row in rows if row.case.run.split == CALIBRATION]
    sources = {side: sorted({run.source for run in runs if run.split == side}) for side in (CALIBRATION, VALIDATION)}
    out = [
        f"Reference: {PUBLISHED.relative_to(ROOT) if PUBLISHED.is_relative_to(ROOT) else PUBLISHED} — "
        f"{len(runs)} runs from {len(sources[CALIBRATION]) + len(sources[VALIDATION])} sources; split by source "
        f"(benchmarks/data/README.md): {len(sources[CALIBRATION])} calibration, {len(sources[VALIDATION])} validation.",
        f"Calibration: {calibration.source}",
    ]
    out += [f"- {line}" for line in timings]
    out += ["", "Held-out error: validation sources only, none used for fitting (planner output is simulated):", ""]
    out += summary_table(held_out, "held-out", with_targets=True)
    out += ["", "Held-out error per GPU (median absolute error):", ""]
    out += per_gpu_table(held_out)
    out += ["", "Worst held-out figures:", ""]
    out += worst_table(held_out, 12)
    out += ["", "In-sample error: calibration sources, which the fit has seen (NOT a measure of accuracy):", ""]
    out += summary_table(in_sample, "in-sample", with_targets=False)
    out += ["", f"Refused ({len(refused)} of {len(runs)} runs), with the planner's reason:", ""]
    by_reason: dict[str, list[str]] = {}
    for run_id, reason in refused.items():
        by_reason.setdefault(reason, []).append(run_id)
    for reason, ids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        out.append(f"- {reason}: {', '.join(sorted(ids))}")
    out += ["", "Fit (on calibration sources only):"]
    out += list(fit_notes) or ["- (shipped calibration; run with --refit to refit and see the stages)"]
    out += [
        "",
        "ASSUMED (workload details the sources leave out):",
        "- runs with a max concurrency: the first max-concurrency prompts sent at once, as `vllm bench serve` does "
        "(the legacy rows of other tools: clients in steady state, start times staggered); runs with no "
        "concurrency limit: every prompt sent at once",
    ]
    for case in cases:
        if case.assumed:
            out.append(f"- {case.run.run_id}: " + "; ".join(case.assumed))
    if full_table:
        out += ["", "Every figure:", ""]
        out += all_rows_table(rows)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--refit", action="store_true", help="fit on the calibration sources only, save the shipped calibration, then evaluate"
    )
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--all-figures", action="store_true", help="list every figure with its prediction")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-shapes", action="store_true")
    args = parse_args(parser)
    scale = 0.02 if args.smoke else 1.0
    progress: Callable[[str], None] = lambda line: print("  ", line, file=sys.stderr, flush=True)  # noqa: E731

    try:
        runs = read_runs(PUBLISHED)
    except UserError as err:
        raise SystemExit(f"error: {err}") from None
    if args.smoke:
        runs = smoke_runs(runs)
    cases, refused = build_cases(runs, 0.1 if args.smoke else 1.0)
    timings: list[str] = []
    fit_notes: list[str] = []
    if args.refit:
        wall, cpu = time.perf_counter(), time.process_time()
        calibration, fit_notes = refit(cases, progress)
        if args.smoke:
            timings.append("smoke: the refit calibration is not saved")
        else:
            calibration.save(CALIBRATION_OUT)
        timings.append(
            f"refit on calibration sources: {time.process_time() - cpu:.0f} s CPU, {time.perf_counter() - wall:.0f} s wall"
        )
    else:
        calibration = default_calibration()
    wall = time.perf_counter()
    predictions, refused_now = predict_each(cases, calibration)
    refused.update(refused_now)
    timings.append(f"predicting {len(cases)} runs: {time.perf_counter() - wall:.0f} s wall")
    out = report(cases, refused, predictions, calibration, fit_notes, timings, runs, args.all_figures)
    if not args.skip_shapes:
        out += ["", "Shape 1 — replicas vs tensor parallelism (planner output):", ""]
        out += shape_replicas_vs_tp(calibration, scale)
        out += ["", "Shape 2 — the knee: Llama-3.1-8B on one H100, 1024 in / 256 out, Poisson arrivals (planner output):", ""]
        out += shape_knee(calibration, scale)
    if not args.skip_speed:
        out += ["", "Speed:"]
        out += speed(calibration, scale)
    text = "\n".join(out)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
