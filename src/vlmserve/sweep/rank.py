"""Choosing: the best operating point of each deployment, and deployments ranked against each other.

The best operating point is the cell with the highest goodput among those meeting every
SLO at the percentile the SLO names, within one workload shape (the sweep's headline shape:
the one with most cells): short prompts always out-serve long ones, so comparing across
shapes would crown the cheapest workload, not the best load level. Deployments are then ranked by goodput per device
and, where a $/GPU-hour is known, by cost per million output tokens at that point.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.spec import SLO
from vlmserve.sweep.results import CellOutcome, SweepResults

_SLO_FIELD = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2e_ms"}


def slo_misses(cell: CellOutcome, slo: SLO) -> list[str]:
    """The objectives this cell misses, e.g. ['ttft_p95 812ms > 500ms']; empty when all are met."""
    goodput = cell.summary.goodput if cell.summary is not None else None
    checks = goodput.checks if goodput is not None else {}
    misses: list[str] = []
    for key, bound_s in sorted(slo.bounds_s.items()):
        check = checks.get(key)
        if check is not None:  # bench already judged this objective; read its verdict
            if not check.met:
                misses.append(_missed(key, check.measured_ms, bound_s))
            continue
        metric, stat = key.split("_", 1)  # an SLO key names a metric and a statistic: ttft_p95
        value_ms = cell.summary.latency(_SLO_FIELD[metric]).stat(stat) if cell.summary is not None else None
        if value_ms is None or value_ms > bound_s * 1000.0:
            misses.append(_missed(key, value_ms, bound_s))
    return misses


def _missed(key: str, measured_ms: float | None, bound_s: float) -> str:
    """'ttft_p95 812.0 ms > 500 ms: missed' (the bench console's wording)."""
    if measured_ms is None:
        return f"{key} not measured: missed"
    return f"{key} {measured_ms:,.1f} ms > {bound_s * 1000.0:g} ms: missed"


def headline_shape(cells: list[CellOutcome]) -> str | None:
    """The workload shape the best points are chosen in: the one with most cells (first seen on a tie)."""
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell.workload_shape] = counts.get(cell.workload_shape, 0) + 1
    return max(counts, key=lambda shape: counts[shape]) if counts else None


def goodput_rps(cell: CellOutcome) -> float | None:
    """Requests/s that met every per-request SLO (bench's goodput); plain throughput when no SLO was set."""
    value = cell.metric("goodput.requests_per_s")
    return value if value is not None else cell.metric("throughput.requests_per_s")


@dataclass(frozen=True)
class DeploymentChoice:
    """A deployment's best operating point and what it costs."""

    deployment: str
    devices: float
    best_cell: str | None
    goodput_rps: float | None
    output_tokens_per_s: float | None
    goodput_per_device: float | None
    output_tokens_per_s_per_device: float | None
    usd_per_million_output_tokens: float | None
    note: str = ""
    workload: str = ""
    """The workload shape the best point was chosen in, in words."""


def best_operating_point(cells: list[CellOutcome], slo: SLO, shape: str | None = None) -> tuple[CellOutcome | None, str]:
    """Highest-goodput cell meeting every SLO within one workload shape, and a note when none does.

    `shape`: a `CellOutcome.workload_shape`; default: the headline shape of `cells`.
    """
    shape = shape if shape is not None else headline_shape(cells)
    ran = [cell for cell in cells if cell.ok and cell.workload_shape == shape]
    if not ran:
        return None, "no cell ran"
    meeting = [cell for cell in ran if not slo_misses(cell, slo)]
    if not meeting:
        return None, "no cell met every SLO"
    return max(meeting, key=lambda cell: goodput_rps(cell) or 0.0), ""


def rank_deployments(results: SweepResults) -> list[DeploymentChoice]:
    """Deployments best first: goodput per device, then (with prices) lower cost per token."""
    choices: list[DeploymentChoice] = []
    shape = headline_shape(results.cells)  # one shape for every deployment, so they rank on the same work
    workload = next((cell.workload_text for cell in results.cells if cell.workload_shape == shape), "")
    for info in results.deployments:
        best, note = best_operating_point(results.cells_of(info.name), results.slo, shape)
        if info.status == "failed":
            note = "deployment failed (reason above)"
        if best is None:
            choices.append(DeploymentChoice(info.name, info.devices, None, None, None, None, None, None, note, workload))
            continue
        goodput = goodput_rps(best)
        tokens = best.metric("throughput.output_tokens_per_s")
        cost = None
        if info.usd_per_gpu_hour is not None and tokens:
            cost = info.usd_per_gpu_hour * info.devices / 3600.0 / tokens * 1e6
        choices.append(
            DeploymentChoice(
                deployment=info.name,
                devices=info.devices,
                best_cell=best.cell,
                goodput_rps=goodput,
                output_tokens_per_s=tokens,
                goodput_per_device=(goodput / info.devices) if goodput is not None else None,
                output_tokens_per_s_per_device=(tokens / info.devices) if tokens is not None else None,
                usd_per_million_output_tokens=cost,
                note=note,
                workload=workload,
            )
        )
    return sorted(choices, key=lambda choice: -(choice.goodput_per_device or -1.0))


def cheapest(choices: list[DeploymentChoice]) -> DeploymentChoice | None:
    """The deployment with the lowest cost per million output tokens, when any price was given."""
    priced = [choice for choice in choices if choice.usd_per_million_output_tokens is not None]
    return min(priced, key=lambda choice: choice.usd_per_million_output_tokens or 0.0) if priced else None
