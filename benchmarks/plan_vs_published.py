"""The planner against published vLLM measurements, its shape checks, and its speed.

Usage:
    .venv/bin/python benchmarks/plan_vs_published.py            # evaluate the shipped calibration
    .venv/bin/python benchmarks/plan_vs_published.py --cv       # + leave-one-id-out cross-validation
    .venv/bin/python benchmarks/plan_vs_published.py --refit    # refit the shipped calibration on all rows
    .venv/bin/python benchmarks/plan_vs_published.py --markdown out.md
    .venv/bin/python benchmarks/plan_vs_published.py --smoke    # seconds: shapes and speed on a few requests

Every row of /work/shared/reference/published_measurements.csv whose model and GPU the
planner knows is compared. Workload details the source leaves out are written next to the
scenario as ASSUMED (never guessed silently). The shipped calibration is fitted on all
rows (`--refit`), so its errors are in-sample; the figures quoted against the targets are
the cross-validated ones (`--cv`): for each published id, the calibration is refitted
without that id and the id is predicted by it. All figures are planner output
(simulated), not measurements.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _smoke import parse_args  # noqa: E402

from vlmserve.plan.calibrate import METRICS, Scenario, errors_by_family, predict, relative_errors  # noqa: E402
from vlmserve.hardware.calibration import Calibration, Efficiency, default_calibration  # noqa: E402
from vlmserve.plan.crossval import CrossValidation, FitStage, StagedFitter, cross_validate  # noqa: E402
from vlmserve.hardware.setup import PlanSetup  # noqa: E402
from vlmserve.plan.simulate import simulate_run  # noqa: E402
from vlmserve.spec import LoadSpec  # noqa: E402

PUBLISHED = Path(os.environ.get("VLMSERVE_PUBLISHED_CSV", ROOT.parent / "shared/reference/published_measurements.csv"))
"""The shared reference data sits beside the checkout (../shared), as in CI; the variable overrides it."""
CALIBRATION_OUT = ROOT / "src/vlmserve/hardware/data/calibration.json"


@dataclass
class Case:
    """How one published measurement id maps onto a planner scenario."""

    model: str
    gpu: str
    tp: int
    dataset: str = "random"
    input_len: int = 1024
    output_len: int = 128
    concurrency: int = 1
    num_requests: int = 100
    weight_dtype: str | None = None
    kv_dtype: str = "bf16"
    async_scheduling: bool = False
    gpu_memory_utilization: float = 0.9
    warmup: int = 0
    staggered: bool = True
    assumed: list[str] = field(default_factory=list)


CASES: dict[str, Case] = {
    "spark-oss-c1": Case("openai/gpt-oss-120b", "gb10", 1, input_len=1000, output_len=128, concurrency=1,
                         num_requests=10, kv_dtype="fp8", gpu_memory_utilization=0.8,
                         assumed=["lengths 1000/128 as the source infers", "10 prompts", "gpu-memory-utilization 0.8"]),
    "spark-oss-c4": Case("openai/gpt-oss-120b", "gb10", 1, input_len=1000, output_len=128, concurrency=4,
                         num_requests=40, kv_dtype="fp8", gpu_memory_utilization=0.8,
                         assumed=["lengths 1000/128", "10×concurrency prompts", "gpu-memory-utilization 0.8"]),
    "spark-oss-c16": Case("openai/gpt-oss-120b", "gb10", 1, input_len=1000, output_len=128, concurrency=16,
                          num_requests=160, kv_dtype="fp8", gpu_memory_utilization=0.8,
                          assumed=["lengths 1000/128", "10×concurrency prompts", "gpu-memory-utilization 0.8"]),
    "spark-oss-c64": Case("openai/gpt-oss-120b", "gb10", 1, input_len=1000, output_len=128, concurrency=64,
                          num_requests=640, kv_dtype="fp8", gpu_memory_utilization=0.8,
                          assumed=["lengths 1000/128", "10×concurrency prompts", "gpu-memory-utilization 0.8"]),
    "h100-oss-tp1": Case("openai/gpt-oss-120b", "h100", 1, dataset="sharegpt", concurrency=1000,
                         num_requests=1000, staggered=False,
                         assumed=["ShareGPT lengths: built-in distribution, means ~215 in / ~195 out",
                                  "KV cache BF16 (vLLM default)"]),
    "h100-oss-tp2": Case("openai/gpt-oss-120b", "h100", 2, dataset="sharegpt", concurrency=1000,
                         num_requests=1000, staggered=False, async_scheduling=True,
                         assumed=["ShareGPT lengths: built-in distribution", "async scheduling: CPU overhead overlaps the GPU step"]),
    "h100-oss-tp4": Case("openai/gpt-oss-120b", "h100", 4, dataset="sharegpt", concurrency=1000,
                         num_requests=1000, staggered=False, assumed=["ShareGPT lengths: built-in distribution"]),
    "h100-qwen3-8b-c4": Case("Qwen/Qwen3-8B", "h100", 1, input_len=1024, output_len=128, concurrency=4,
                             num_requests=100,
                             assumed=["input/output 1024/128 (vllm bench random defaults; source: unknown)",
                                      "100 prompts"]),
    "h100-llama3-8b": Case("meta-llama/Meta-Llama-3-8B-Instruct", "h100", 1, input_len=1024, output_len=128,
                           concurrency=1, num_requests=10,
                           assumed=["input/output 1024/128 (vllm bench random defaults; source: unknown)"]),
    "l4x4-qwen3-4b": Case("Qwen/Qwen3-4B", "l4", 4, input_len=1024, output_len=200, concurrency=32,
                          num_requests=320,
                          assumed=["input 1024 (source: unknown)",
                                   "output 200, inferred from the row: 32/5.6 req/s = 5.7 s per request = TTFT + 199×TPOT",
                                   "10×concurrency prompts"]),
}

FIT_STAGES: list[FitStage] = [
    # Separable physics, fitted in order so one kind of row cannot bend another's coefficients.
    # Rows of the L4 (one id) fit nothing of their own: L4 is always predicted with the
    # H100-fitted efficiencies and the PCIe priors below, i.e. out-of-sample.
    # Memory bandwidth is not fitted here: see PRIOR. The two dense rows (unknown lengths, one
    # of unknown vLLM version) pull it apart: fitted on the Llama row alone it fell to 0.75.
    FitStage("dense prefill on H100", ("h100-llama3-8b", "h100-qwen3-8b-c4"),
             (("default", "compute"),)),
    # MoE kernel efficiency is per GPU: Hopper has no FP4 tensor cores (MXFP4 is dequantized in
    # the kernel), Blackwell's GB10 runs it natively.
    FitStage("MoE kernels, routing spread, memory reserve on H100", ("h100-oss-tp1", "h100-oss-tp2", "h100-oss-tp4"),
             (("default", "moe_efficiency"), ("default", "moe_expert_spread"), ("default", "reserved_memory_gb"))),
    # The spark rows send random-token prompts, not text: their expert routing is fitted apart.
    FitStage("GB10 compute and routing spread", ("spark-oss-c1", "spark-oss-c4", "spark-oss-c16", "spark-oss-c64"),
             (("gb10", "compute"), ("gb10", "moe_expert_spread"))),
]
FIT_EVALUATIONS = 60
"""Simulations per stage (Nelder–Mead over 3 coefficients converges to ~1 % in fewer)."""


PRIOR = Calibration(
    Efficiency(
        # Not fitted: memory-bound kernels reach roughly 90 % of datasheet HBM bandwidth in copy
        # benchmarks, and the same fraction is assumed for GDDR and GB10's LPDDR5x. The serving
        # rows cannot pin it better (their lengths are unknown); every all-rows fit that left
        # it free ended on this value, the upper bound of its range.
        bandwidth=0.9,
        step_overhead_s=0.0015,  # not fitted: a single dense row cannot separate it from bandwidth
        # starting points of the fit (overwritten by it): MoE kernels slower than dense, skewed routing
        moe_efficiency=0.5, moe_expert_spread=0.5, reserved_memory_gb=3.0,
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


def read_published() -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = {}
    with PUBLISHED.open() as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(row["id"], []).append(row)
    return rows


def build_scenarios(published: dict[str, list[dict[str, str]]]) -> tuple[list[Scenario], list[str]]:
    scenarios: list[Scenario] = []
    skipped: list[str] = []
    for case_id, rows in published.items():
        case = CASES.get(case_id)
        if case is None:
            skipped.append(f"{case_id}: no planner scenario defined")
            continue
        measured = {}
        for row in rows:
            if row["metric"] in METRICS:
                measured[row["metric"]] = float(row["value"])
            else:
                skipped.append(f"{case_id}.{row['metric']}: metric not expressible")

        def build(calibration: Calibration, case: Case = case) -> PlanSetup:
            return PlanSetup.from_names(
                case.model, case.gpu, tp=case.tp, weight_dtype=case.weight_dtype, kv_dtype=case.kv_dtype,
                calibration=calibration, async_scheduling=case.async_scheduling,
                gpu_memory_utilization=case.gpu_memory_utilization,
            )

        load = LoadSpec(
            dataset=case.dataset, dataset_path="builtin" if case.dataset == "sharegpt" else None,
            input_len=case.input_len, output_len=case.output_len, concurrency=case.concurrency,
            num_requests=case.num_requests, warmup=case.warmup,
        )
        scenarios.append(Scenario(case_id, build, load, measured, staggered=case.staggered))
    return scenarios, skipped


TARGETS = {"throughput": 0.15, "tpot/itl": 0.15, "ttft": 0.25}


def comparison_table(
    scenarios: list[Scenario], predictions: dict[str, dict[str, float]], cv: dict[str, dict[str, float]] | None
) -> list[str]:
    """One line per published metric: the shipped (all-rows) fit and, with --cv, the out-of-fold prediction."""
    def cell(value: float | None, measured: float) -> tuple[str, str]:
        if value is None:
            return "n/a", "n/a"
        return f"{value:.4g}", f"{value / measured - 1:+.0%}"

    header = "| id | metric | published | planner, fit on all rows | error |"
    rule = "|---|---|---:|---:|---:|"
    if cv is not None:
        header += " planner, fit without this id (CV) | CV error |"
        rule += "---:|---:|"
    lines = [header, rule]
    for scenario in scenarios:
        for metric, measured in scenario.measured.items():
            shown, error = cell(predictions[scenario.scenario_id].get(metric), measured)
            line = f"| {scenario.scenario_id} | {metric} | {measured:g} | {shown} | {error} |"
            if cv is not None:
                cv_shown, cv_error = cell(cv.get(scenario.scenario_id, {}).get(metric), measured)
                line += f" {cv_shown} | {cv_error} |"
            lines.append(line)
    return lines


def error_summary(
    scenarios: list[Scenario], predictions: dict[str, dict[str, float]], cv: dict[str, dict[str, float]] | None
) -> list[str]:
    """Median absolute error per metric family: cross-validated (quoted) and in-sample."""
    in_sample = errors_by_family(relative_errors(scenarios, predictions))
    out_of_fold = errors_by_family(relative_errors(scenarios, cv)) if cv is not None else {}
    counts: dict[str, int] = {}
    for _id, metric, _error in relative_errors(scenarios, predictions):
        counts[METRICS[metric].family] = counts.get(METRICS[metric].family, 0) + 1
    lines = ["| metric family | values | CV median abs error (quoted) | in-sample, fit on all rows | target |",
             "|---|---:|---:|---:|---|"]
    for family, value in in_sample.items():
        target = TARGETS.get(family)
        cv_cell = f"**{out_of_fold[family]:.1%}**" if family in out_of_fold else "(run with --cv)"
        verdict = ""
        if target is not None and family in out_of_fold:
            verdict = " met" if out_of_fold[family] <= target else " MISSED"
        lines.append(f"| {family} | {counts[family]} | {cv_cell} | {value:.1%} | "
                     f"{f'≤ {target:.0%}{verdict}' if target else '–'} |")
    return lines


def scaled(requests: int, scale: float) -> int:
    """A request count shrunk for --smoke (`scale` < 1), never below a handful."""
    return max(8, int(requests * scale))


def shape_replicas_vs_tp(calibration: Calibration, scale: float = 1.0) -> list[str]:
    """Llama-3.1-8B (fits one H100): N TP1 replicas vs one TPN server on the same N GPUs, same heavy load."""
    lines = ["| GPUs | deployment | output tok/s | mean TTFT ms | mean TPOT ms |", "|---:|---|---:|---:|---:|"]
    ratios = []
    for gpus in (2, 4):
        load = LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=256 * gpus,
                        num_requests=scaled(1000 * gpus, scale))
        results = {}
        for label, tp, replicas in ((f"{gpus} replicas × TP1", 1, gpus), (f"1 replica × TP{gpus}", gpus, 1)):
            setup = PlanSetup.from_names("llama-3.1-8b", "h100", tp=tp, replicas=replicas, calibration=calibration)
            summary = simulate_run(setup, load).result.summary
            results[tp] = summary.throughput.output_tokens_per_s
            lines.append(f"| {gpus} | {label} | {results[tp]:.0f} | {summary.ttft_ms.mean:.0f} | "
                         f"{summary.tpot_ms.mean:.1f} |")
        ratios.append((gpus, results[1] / results[gpus]))
    lines.append("")
    for gpus, ratio in ratios:
        lines.append(f"On {gpus} GPUs, independent replicas give {ratio:.2f}× the output throughput of one TP{gpus} "
                     f"server ({'reproduces' if ratio > 1 else 'does NOT reproduce'} the published finding).")
    return lines


def shape_knee(calibration: Calibration, scale: float = 1.0) -> list[str]:
    """Llama-3.1-8B on one H100, open loop at rising rates: throughput flattens, TTFT climbs."""
    lines = ["| offered rate req/s | achieved req/s | output tok/s | mean TTFT ms | p99 TTFT ms |",
             "|---:|---:|---:|---:|---:|"]
    setup = PlanSetup.from_names("llama-3.1-8b", "h100", calibration=calibration)
    for rate in (4, 8, 16, 24, 32, 40, 48, 64):
        load = LoadSpec(input_len=1024, output_len=256, rate=float(rate), num_requests=scaled(max(400, rate * 30), scale))
        summary = simulate_run(setup, load, record_token_times=True).result.summary
        lines.append(f"| {rate} | {summary.throughput.requests_per_s:.1f} | "
                     f"{summary.throughput.output_tokens_per_s:.0f} | {summary.ttft_ms.mean:.0f} | "
                     f"{summary.ttft_ms.p99:.0f} |")
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
    lines = [f"- one configuration, {load.num_requests:,} requests (Llama-3.1-8B, H100, 1024/128, concurrency 64): "
             f"best of 3 {min(walls):.2f} s wall, {min(cpus):.2f} s CPU (one process, one core)"]
    from vlmserve.plan.search import SearchSpace, run_search
    from vlmserve.spec import SLO

    space = SearchSpace(
        model="llama-3.1-8b", gpus=["h100", "h200", "l40s", "a100"] if scale == 1.0 else ["h100"], tps=[1, 2, 4],
        replicas=[1, 2, 3, 4], max_num_seqs=[64, 128, 256], max_gpus=8,
    )
    load = LoadSpec(input_len=1024, output_len=128, rate=20.0, num_requests=scaled(300, scale))
    slo = SLO.parse("ttft_p95=1s,tpot_p95=60ms")
    for prune in (True, False):
        wall, cpu = time.perf_counter(), time.process_time()
        outcome = run_search(space, load, slo, prices={"h100": 3.0, "h200": 4.0, "l40s": 1.2, "a100": 2.0},
                             calibration=calibration, prune=prune)
        lines.append(
            f"- search {'with' if prune else 'without'} pruning: {outcome.evaluated} configurations, "
            f"{outcome.simulated} simulated ({load.num_requests} requests each), {time.perf_counter() - wall:.1f} s wall, "
            f"{time.process_time() - cpu:.1f} s CPU; best: {outcome.best.label if outcome.best else 'none'}"
        )
    return lines


def fit_calibration(scenarios: list[Scenario], fitter: StagedFitter) -> Calibration:
    """The shipped calibration: every stage on every row it has."""
    calibration = fitter.fit(scenarios, PRIOR)
    calibration.source = (
        "fitted by benchmarks/plan_vs_published.py --refit on all published rows ("
        + ", ".join(s.scenario_id for s in scenarios)
        + "); quote its cross-validated errors (--cv), not its in-sample ones"
    )
    calibration.fit_error = {
        family: round(value, 4)
        for family, value in errors_by_family(relative_errors(scenarios, predict(scenarios, calibration))).items()
    }
    return calibration


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", action="store_true", help="fit the shipped calibration on all rows and save it")
    parser.add_argument("--cv", action="store_true", help="leave-one-id-out cross-validation (refits once per id)")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-shapes", action="store_true")
    args = parse_args(parser)
    scale = 0.02 if args.smoke else 1.0

    if not PUBLISHED.is_file():
        raise SystemExit(f"error: {PUBLISHED} not found: put the shared reference data beside the checkout "
                         "(../shared) or set VLMSERVE_PUBLISHED_CSV")
    published = read_published()
    scenarios, skipped = build_scenarios(published)
    fitter = StagedFitter(FIT_STAGES, max_evaluations=FIT_EVALUATIONS,
                          progress=lambda line: print("  ", line, file=sys.stderr, flush=True))
    timings: list[str] = []
    if args.refit:
        wall, cpu = time.perf_counter(), time.process_time()
        calibration = fit_calibration(scenarios, fitter)
        calibration.save(CALIBRATION_OUT)
        timings.append(f"refit on all rows: {time.process_time() - cpu:.0f} s CPU, {time.perf_counter() - wall:.0f} s wall; "
                       f"saved {CALIBRATION_OUT.relative_to(ROOT)}")
    else:
        calibration = default_calibration()
    cv: CrossValidation | None = None
    if args.cv:
        wall, cpu = time.perf_counter(), time.process_time()
        cv = cross_validate(scenarios, {}, fitter, PRIOR)
        timings.append(f"cross-validation ({len(scenarios)} folds, one per id, each refitted from the prior): "
                       f"{time.process_time() - cpu:.0f} s CPU, {time.perf_counter() - wall:.0f} s wall, "
                       f"{fitter.simulations} scenario simulations in all")
    predictions = predict(scenarios, calibration)
    cv_predictions = cv.predictions if cv is not None else None

    out: list[str] = []
    out.append(f"Calibration: {calibration.source}")
    out += [f"- {line}" for line in timings]
    out.append("")
    out += error_summary(scenarios, predictions, cv_predictions)
    out.append("")
    out += comparison_table(scenarios, predictions, cv_predictions)
    out.append("")
    out.append("Fit stages (each a bounded Nelder–Mead over the log of its coefficients, "
               f"{FIT_EVALUATIONS} simulations at most, in this order; a CV fold skips the held-out id):")
    for stage in FIT_STAGES:
        coefficients = ", ".join(f"{name} ({target})" for target, name in stage.parameters)
        out.append(f"- {stage.title}: {coefficients} on {', '.join(stage.rows)}")
    out.append("- not fitted (priors): " + prior_description())
    out.append("")
    out.append("Assumptions (workload details the sources do not give):")
    out.append("- every closed-loop row: clients in steady state (start times staggered over one request's "
               "duration) rather than one synchronized first wave; see `simulate_run(staggered=True)`")
    for scenario in scenarios:
        case = CASES[scenario.scenario_id]
        out.append(f"- {scenario.scenario_id}: " + "; ".join(case.assumed))
    for line in skipped:
        out.append(f"- skipped {line}")
    if not args.skip_shapes:
        out.append("")
        out.append("Shape 1 — replicas vs tensor parallelism (planner output):")
        out.append("")
        out += shape_replicas_vs_tp(calibration, scale)
        out.append("")
        out.append("Shape 2 — the knee: Llama-3.1-8B on one H100, 1024 in / 256 out, Poisson arrivals (planner output):")
        out.append("")
        out += shape_knee(calibration, scale)
    if not args.skip_speed:
        out.append("")
        out.append("Speed:")
        out += speed(calibration, scale)
    text = "\n".join(out)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


def prior_description() -> str:
    """The coefficients no stage fits, as the prior sets them."""
    fitted = {(target, name) for stage in FIT_STAGES for target, name in stage.parameters}
    parts = [f"{name} {getattr(PRIOR.default, name):g}" for name in
             ("bandwidth", "step_overhead_s", "per_seq_overhead_s", "interconnect", "allreduce_latency_s")
             if ("default", name) not in fitted]
    for gpu, values in PRIOR.per_gpu.items():
        parts += [f"{name} {value:g} ({gpu})" for name, value in values.items() if (gpu, name) not in fitted]
    return ", ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
