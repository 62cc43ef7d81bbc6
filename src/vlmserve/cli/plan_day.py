"""`vlmserve plan day`: the autoscaling rule over a day of traffic, simulated, against fixed replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.table import Table

from vlmserve.errors import UserError

if TYPE_CHECKING:
    from vlmserve.autoscale import AutoscaleRule
    from vlmserve.bench.load_shapes import LoadShape
    from vlmserve.plan.day import DayPlan, ReplicaModel
    from vlmserve.spec import DeploymentSpec

SPARK = " ▁▂▃▄▅▆▇█"


def _sparkline(timeline: list[list[float]], duration_s: float, peak: int, buckets: int = 48) -> str:
    """Replicas over time, the highest count in each of `buckets` slices."""
    if not timeline or peak <= 0:
        return ""
    marks = []
    for number in range(buckets):
        low, high = duration_s * number / buckets, duration_s * (number + 1) / buckets
        inside = [count for at, count in timeline if low <= at < high]
        before = [count for at, count in timeline if at < low]
        value = max(inside) if inside else (before[-1] if before else timeline[0][1])
        marks.append(SPARK[round(value / peak * (len(SPARK) - 1))])
    return "".join(marks)


def day(
    load_shape: str = typer.Option(
        ...,
        "--load-shape",
        help="The day's traffic: trace:FILE[@SECONDS] (TIME,RATE lines), or steps/ramp/burst as `bench --load-shape`.",
    ),
    file: Optional[Path] = typer.Option(
        None, "-f", "--file", help="Deployment spec: its autoscale: rule and sim timings are the defaults."
    ),
    autoscale: Optional[str] = typer.Option(
        None, "--autoscale", metavar="MIN:MAX", help="Replica bounds of the rule (other settings from the spec's autoscale:)."
    ),
    cold_start_s: Optional[float] = typer.Option(
        None,
        "--cold-start-s",
        help="Seconds from a scale-up decision to the new replica serving (default: the spec's sim cold start, else 60).",
    ),
    max_num_seqs: Optional[int] = typer.Option(
        None, "--max-num-seqs", min=1, help="Requests one replica runs at once (default: the spec's, else 8)."
    ),
    ttft_ms: Optional[float] = typer.Option(
        None,
        "--ttft-ms",
        help="Time to first token of a request that finds a free slot (default: the spec's sim ttft_ms, else 50).",
    ),
    itl_ms: Optional[float] = typer.Option(
        None, "--itl-ms", help="Then one token every this many ms (default: the spec's sim itl_ms, else 10)."
    ),
    output_len: int = typer.Option(64, "--output-len", min=1, help="Output tokens per request."),
    slo: str = typer.Option(
        "ttft_p95=1s", "--slo", help="The TTFT objective each request is held to (its bound; the percentile is not used)."
    ),
    price: Optional[float] = typer.Option(None, "--price", min=0.0, help="Dollars per replica-hour, for cost per day."),
    seed: int = typer.Option(0, "--seed", help="Random seed for arrivals."),
    json_out: Optional[Path] = typer.Option(
        None, "--json-out", help="Write the plan (every strategy, replicas over time) as JSON."
    ),
) -> None:
    """Simulate the autoscaling rule, cold starts included, over a traffic shape; compare with fixed replicas at peak and mean."""
    from vlmserve.autoscale import AutoscaleRule
    from vlmserve.bench.load_shapes import parse_load_shape
    from vlmserve.cli.up import with_autoscale_bounds
    from vlmserve.plan.day import plan_day
    from vlmserve.spec import SLO, DeploymentSpec, load_deployment_spec

    spec = load_deployment_spec(file) if file is not None else DeploymentSpec(engine="sim")
    if autoscale is not None:
        spec = with_autoscale_bounds(spec, autoscale)
    rule = spec.autoscale or AutoscaleRule()
    objectives = SLO.parse(slo)
    ttft_bounds = [value for key, value in objectives.bounds_s.items() if key.startswith("ttft_")]
    if not ttft_bounds:
        raise UserError(f"--slo {slo}: plan day holds each request to a TTFT bound; give one, e.g. ttft_p95=1s")
    cold, replica = _replica_model(spec, cold_start_s, max_num_seqs, ttft_ms, itl_ms, output_len)
    shape = parse_load_shape(load_shape)
    plan = plan_day(shape, rule, replica, min(ttft_bounds), cold, price, seed)
    console = _print_day(plan, shape, rule, cold, replica)
    if json_out is not None:
        try:
            json_out.write_text(json.dumps(plan.as_dict(), indent=2))
        except OSError as err:
            raise UserError(f"--json-out {json_out}: cannot write it ({err.strerror})") from None
        console.print(f"wrote {json_out}")


def _replica_model(
    spec: DeploymentSpec,
    cold_start_s: float | None,
    max_num_seqs: int | None,
    ttft_ms: float | None,
    itl_ms: float | None,
    output_len: int,
) -> tuple[float, ReplicaModel]:
    """(cold start s, one replica's service): each flag given, else the spec's sim timings, else the defaults."""
    import math

    from vlmserve.plan.day import ReplicaModel

    cold = cold_start_s if cold_start_s is not None else (spec.sim.cold_start_s if spec.sim.cold_start_s is not None else 60.0)
    for flag, value in (("--cold-start-s", cold), ("--ttft-ms", ttft_ms), ("--itl-ms", itl_ms)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UserError(f"{flag} {value:g}: give 0 or more")
    replica = ReplicaModel(
        slots=max_num_seqs or spec.engine_args.max_num_seqs or 8,
        ttft_s=(ttft_ms if ttft_ms is not None else spec.sim.ttft_ms if spec.sim.ttft_ms is not None else 50.0) / 1000,
        itl_s=(itl_ms if itl_ms is not None else spec.sim.itl_ms if spec.sim.itl_ms is not None else 10.0) / 1000,
        output_len=output_len,
    )
    if replica.service_s <= 0:
        raise UserError("--ttft-ms and --itl-ms are both 0: a replica would serve without limit; give a time")
    return cold, replica


def _print_day(plan: DayPlan, shape: LoadShape, rule: AutoscaleRule, cold: float, replica: ReplicaModel) -> Console:
    """The simulated day: the rule and one replica's capacity, then a row per strategy (the console, to say more)."""
    console = Console(highlight=False, width=max(140, Console().width))
    console.print(
        f"[yellow]planner output (SIMULATED, not measured)[/]: {shape.text} over {shape.duration_s:g} s, "
        f"rule {rule.min_replicas}..{rule.max_replicas} replicas at {rule.waiting_per_replica:g} waiting each, "
        f"cold start {cold:g} s; a replica serves {replica.capacity_rps:.2f} req/s at most "
        f"({replica.slots} at once, {replica.service_s * 1000:.0f} ms each)"
    )
    table = Table(title_justify="left")
    for column in ("strategy", "requests", "met SLO", "replica-hours", "cost per day", "peak", "replicas over time"):
        table.add_column(column, justify="left" if column in ("strategy", "replicas over time") else "right")
    peak = max(result.peak_replicas for result in (plan.autoscaled, plan.fixed_peak, plan.fixed_mean))
    for result in (plan.autoscaled, plan.fixed_peak, plan.fixed_mean):
        row = result.as_dict()
        table.add_row(
            result.strategy,
            str(result.requests),
            f"{result.attainment:.1%}",
            f"{row['replica_hours']:.2f}",
            "-" if result.cost_per_day is None else f"${result.cost_per_day:,.2f}",
            str(result.peak_replicas),
            _sparkline(row["timeline"], shape.duration_s, peak),
        )
    console.print(table)
    return console
