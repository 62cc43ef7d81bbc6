"""The per-request records behind a report's cells, read from the run history's Parquet files.

Plots that need more than a summary (latency CDFs, a run's timeline) read records; a
summary alone cannot give a distribution's shape or its drift over time. Records live at
`store.records_dir()/<run_id>.parquet` for bench, sweep, planner and imported runs alike; a cell
whose records are missing (pruned history, a summary-only import) is simply left out of
those plots, never an error.
"""

from __future__ import annotations

from collections.abc import Callable

from vlmserve.results.records import RequestRecord
from vlmserve.sweep.results import CellOutcome

RecordsLoader = Callable[[CellOutcome], list[RequestRecord]]
"""Gives a cell's measured records (warm-up excluded); [] when none are stored."""


def stored_records(cell: CellOutcome) -> list[RequestRecord]:
    """The cell's run records from the history, warm-up left out; [] when absent or unreadable."""
    from vlmserve.results import store

    if not cell.ok or not cell.run_id:
        return []
    path = store.records_dir() / f"{cell.run_id}.parquet"
    if not path.exists():
        return []
    try:
        records = store.read_records_parquet(path)
    except Exception:  # noqa: BLE001 - a damaged file costs its plots, not the report
        return []
    return [record for record in records if not record.warmup]
