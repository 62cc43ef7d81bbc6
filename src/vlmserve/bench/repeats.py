"""Repeated runs of one load, and the 95 % confidence interval of each headline figure.

Why: on a shared machine one run's figure moves by ±10 % from run to run, so a single
number cannot tell a regression from noise. `LoadSpec.repeat = N` runs the same load N
times, each with its own seed (fresh prompts: the engine's prefix cache has not seen them),
and reports, per headline figure, the mean over the N per-repeat values and a 95 % interval.

Rules kept:
- the interval is Student's t over the N per-repeat values: mean ± t(0.975, N−1) · s / √N,
  with s the sample standard deviation; the t quantiles are a small table (no scipy);
  one repeat has no interval and is labelled a single run;
- the repeats are stored as ONE run (one run id): its records are every repeat's records
  (request ids prefixed `r<k>-`), its figures are computed by `metrics.summarize` over the
  pooled records with the sum of the repeats' measurement windows as the duration, and its
  `repeats` block holds the per-repeat values, the intervals and each repeat's SLO verdict;
- repeat k uses seed `seed + k × REPEAT_SEED_STRIDE`, so repeats never draw the prompts of a
  sweep's neighbouring cell (cells differ in seed by 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict

from rich.console import Console
from typing_extensions import Unpack

from vlmserve.bench.target import Target
from vlmserve.json_types import JSONObject
from vlmserve.results.blocks import ConfidenceInterval, RepeatRow, RepeatsBlock
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary
from vlmserve.spec import SLO, LoadSpec

if TYPE_CHECKING:
    from vlmserve.results.metrics import ClientLimits  # numpy: imported when a run starts, not with the CLI

REPEAT_SEED_STRIDE = 100_003
"""Seed step between repeats; larger than any sweep's cell count, so seeds never collide."""

CONFIDENCE = 0.95

INTERVAL_METRICS: tuple[str, ...] = (
    "throughput.requests_per_s",
    "throughput.output_tokens_per_s",
    "ttft_ms.p50",
    "ttft_ms.p95",
    "ttft_ms.p99",
    "tpot_ms.p50",
    "tpot_ms.p95",
    "itl_ms.p95",
    "e2e_ms.p95",
)
"""Figures (results.summary.FIGURES) that get an interval (the headline figures `compare` judges)."""

_T_975: dict[int, float] = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}
"""Two-sided 95 % quantiles of Student's t by degrees of freedom (standard tables)."""


def t_quantile_975(degrees_of_freedom: int) -> float:
    """t(0.975, df); between table rows the smaller df's value (a slightly wider, safe interval)."""
    if degrees_of_freedom < 1:
        raise ValueError("an interval needs at least two values")
    known = [df for df in _T_975 if df <= degrees_of_freedom]
    return _T_975[max(known)] if degrees_of_freedom <= 120 else 1.960


def confidence_interval(values: Sequence[float]) -> ConfidenceInterval:
    """Mean and 95 % t-interval of per-repeat values; `low`/`high` None for a single value."""
    count = len(values)
    mean = sum(values) / count
    if count < 2:
        return ConfidenceInterval(mean=mean, low=None, high=None, half_width=None, values=list(values))
    variance = sum((value - mean) ** 2 for value in values) / (count - 1)
    half = t_quantile_975(count - 1) * math.sqrt(variance / count)
    return ConfidenceInterval(mean=mean, low=mean - half, high=mean + half, half_width=half, values=list(values))


def repeat_seed(seed: int, index: int) -> int:
    """The seed of repeat `index` (0 is the load's own seed)."""
    return seed + index * REPEAT_SEED_STRIDE


def repeat_verdict(summary: RunSummary, max_failed_fraction: float) -> bool | None:
    """Did one repeat meet its SLOs: every check met, few enough failures, not stopped early.

    None when the run had no SLO.
    """
    good = summary.goodput
    if good is None:
        return None
    total = summary.requests.total
    failed_fraction = summary.requests.failed / total if total else 1.0
    stopped = summary.meta.stopped
    return good.all_met and failed_fraction <= max_failed_fraction and not stopped


class RunOptions(TypedDict, total=False):
    """The keyword options `run_repeated` passes through to each `run_load` (see its docstring)."""

    progress: bool
    label: str | None
    deployment: JSONObject | None
    client_limits: ClientLimits
    stop_on_ctrl_c: bool
    server_metrics_interval_s: float
    engine_traces: str | None


MAX_FAILED_FRACTION = 0.01
"""A repeat whose requests failed more often than this misses its SLOs whatever its latencies."""


def _repeat_row(index: int, seed: int, result: RunResult) -> RepeatRow:
    summary = result.summary
    checks = summary.goodput.checks if summary.goodput is not None else {}
    return RepeatRow(
        repeat=index + 1,
        seed=seed,
        duration_s=summary.duration_s,
        completed=summary.requests.completed,
        failed=summary.requests.failed,
        stopped=summary.meta.stopped,
        slo_met=repeat_verdict(summary, MAX_FAILED_FRACTION),
        slo_checks={key: check.measured_ms for key, check in checks.items()},
        figures={name: summary.figure(name) for name in INTERVAL_METRICS},
    )


def combine(results: list[RunResult], load: LoadSpec, slo: SLO | None) -> RunResult:
    """One RunResult for N repeats: pooled records and figures, per-repeat values and intervals."""
    from vlmserve.results import metrics

    seeds = [repeat_seed(load.seed, index) for index in range(len(results))]
    if len(results) == 1:
        only = results[0]
        only.summary.repeats = RepeatsBlock(count=1, single_run=True, runs=[_repeat_row(0, seeds[0], only)])
        return only
    records = []
    for index, result in enumerate(results):
        for record in result.records:
            record.request_id = f"r{index + 1}-{record.request_id}"
            records.append(record)
    window = sum(result.summary.duration_s for result in results)
    summary = metrics.summarize(records, slo, duration_s=window)
    first, last = results[0].summary, results[-1].summary
    clients = [result.summary.client for result in results]
    summary.client = clients[0].model_copy(
        update={
            "limited": any(block.limited for block in clients),
            "limited_reasons": [
                f"repeat {index + 1}: {reason}" for index, block in enumerate(clients) for reason in block.limited_reasons
            ],
        }
    )
    summary.server = last.server  # the last repeat's counters: caches at their warmest
    summary.prefix_cache = last.prefix_cache
    summary.warnings = [f"repeat {index + 1}: {warning}" for index, result in enumerate(results) for warning in result.warnings]
    metas = [result.meta for result in results]
    summary.meta = first.meta.model_copy(
        update={
            "load_spec": load.model_dump(mode="json"),
            "interrupted": any(meta.interrupted for meta in metas),
            "post_run_failed": any(meta.post_run_failed for meta in metas),
            "client_limited": summary.client.limited,
            "stopped": next((meta.stopped for meta in metas if meta.stopped), None),
        }
    )
    rows = [_repeat_row(index, seeds[index], result) for index, result in enumerate(results)]
    intervals: dict[str, ConfidenceInterval] = {}
    for path in INTERVAL_METRICS:
        values = [row.figures[path] for row in rows]
        present = [value for value in values if value is not None]
        if len(present) == len(values):
            intervals[path] = confidence_interval(present)
    summary.repeats = RepeatsBlock(
        count=len(results),
        single_run=False,
        method="student-t over per-repeat values",
        confidence=CONFIDENCE,
        seeds=seeds,
        intervals=intervals,
        runs=rows,
    )
    return RunResult(records=records, summary=summary)


async def run_repeated(
    load: LoadSpec,
    target: Target,
    *,
    console: Console | None = None,
    slo: SLO | None = None,
    settled: Callable[[list[RunResult]], bool] | None = None,
    **run_options: Unpack[RunOptions],
) -> RunResult:
    """Run `load` `load.repeat` times (fresh seeds) and combine; Ctrl-C keeps what ran.

    `settled(results so far)` may end the repeats early (the SLO search stops once a majority
    has decided the point).
    """
    from vlmserve.bench.runner import run_load

    console = console or Console(stderr=True)
    results: list[RunResult] = []
    for index in range(load.repeat):
        single = load.model_copy(update={"seed": repeat_seed(load.seed, index), "repeat": 1})
        if load.repeat > 1:
            console.print(f"repeat {index + 1} of {load.repeat} (seed {single.seed})")
        result = await run_load(single, target, console=console, slo=slo, **run_options)
        results.append(result)
        if result.meta.interrupted or (settled is not None and settled(results)):
            break
    combined = combine(results, load, slo)
    combined.meta.load_spec = load.model_dump(mode="json")
    return combined
