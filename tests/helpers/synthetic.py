"""Synthetic RequestRecords for a server that saturates, summarised by the bench's own metrics code.

Used by the report and knee tests that need many load levels fast; the end-to-end tests
measure real (sim-engine) runs instead.
"""

from __future__ import annotations

from typing import Any

from vlmserve.results.metrics import summarize
from vlmserve.results.records import RequestRecord
from vlmserve.spec import SLO
from vlmserve.sweep.results import CellOutcome, DeploymentInfo, SweepResults


def saturating_records(
    concurrency: int,
    *,
    capacity: int = 8,
    ttft_s: float = 0.05,
    tpot_s: float = 0.01,
    output_tokens: int = 32,
    requests: int = 64,
    slowdown: float = 1.0,
) -> list[RequestRecord]:
    """Closed-loop waves of `concurrency` users; past `capacity` users each step slows down (queueing)."""
    pressure = max(1.0, concurrency / capacity)
    step_s = tpot_s * pressure * slowdown
    first_s = ttft_s * pressure**2 * slowdown
    e2e_s = first_s + step_s * (output_tokens - 1)
    records = []
    for index in range(requests):
        sent = 1000.0 + (index // concurrency) * e2e_s + (index % concurrency) * 1e-4
        chunks = [sent + first_s + step_s * token for token in range(output_tokens)]
        records.append(
            RequestRecord(
                request_id=f"r{index}",
                scheduled_at_s=sent,
                sent_at_s=sent,
                first_token_at_s=chunks[0],
                finished_at_s=chunks[-1],
                chunk_times_s=chunks,
                chunk_tokens=[1] * output_tokens,
                prompt_tokens=128,
                output_tokens=output_tokens,
                ok=True,
            )
        )
    return records


def sweep_results(
    levels: list[int], deployments: dict[str, float], slo: SLO | None = None, failed_cell: tuple[str, str] | None = None
) -> SweepResults:
    """A sweep over `levels` users for each deployment (name -> slowdown factor)."""
    return sweep_with_records(levels, deployments, slo, failed_cell)[0]


def sweep_with_records(
    levels: list[int], deployments: dict[str, float], slo: SLO | None = None, failed_cell: tuple[str, str] | None = None
) -> tuple[SweepResults, dict[str, list[RequestRecord]]]:
    """`sweep_results` and the records behind each finished cell, by run id."""
    by_run: dict[str, list[RequestRecord]] = {}
    slo = slo or SLO()
    infos: list[DeploymentInfo] = []
    cells: list[CellOutcome] = []
    for name, slowdown in deployments.items():
        infos.append(
            DeploymentInfo(
                name=name,
                kind="managed",
                devices=1.0,
                usd_per_gpu_hour=2.0,
                status="done",
                spec={"name": name, "engine": "sim"},
                server_version="sim-0",
            )
        )
        for level in levels:
            cell_name = f"c{level}"
            load: dict[str, Any] = {"dataset": "random", "input_len": 128, "output_len": 32, "concurrency": level}
            if (name, cell_name) == failed_cell:
                cells.append(CellOutcome(name, cell_name, load, "failed", reason="all 64 requests failed (http_500 ×64)"))
                continue
            records = saturating_records(level, slowdown=slowdown)
            summary = summarize(records, slo if slo.bounds_s else None)
            by_run[f"run-{name}-{level}"] = records
            cells.append(CellOutcome(name, cell_name, load, "done", run_id=f"run-{name}-{level}", summary=summary))
    return SweepResults(name="synthetic", deployments=infos, cells=cells, slo=slo, source="synthetic"), by_run
