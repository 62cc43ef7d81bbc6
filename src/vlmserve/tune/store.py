"""The tune store: one JSON file per tune directory, rewritten atomically after every candidate.

Why a file of its own (beside the run history in DuckDB, which keeps every probe run): a
resumed tune must know which candidates are finished, what they measured and why others failed,
without re-measuring them, and Ctrl-C or a crash at any instant must leave either the old file or
the new one (a temporary file renamed over it), never half of one. The store names the study it
belongs to by a fingerprint of what is measured (spec, flags, workload, SLO, search settings);
running a different study into the same directory is refused, with `--restart` as the way out.
A file that is not a tune store (truncated, edited, another tool's) is one line, never a traceback.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vlmserve.bounded_read import CONFIG_FILE, Refused, loads_json, read_bytes
from vlmserve.errors import UserError

STORE_FILE = "tune.json"
STORE_VERSION = 1


class Interval(BaseModel):
    """Goodput bounds from the SLO search: held at `low` req/s, missed at `high` (None: never missed)."""

    model_config = ConfigDict(extra="forbid")

    low: float = Field(ge=0)
    high: float | None = None


class CandidateRecord(BaseModel):
    """What happened to one candidate: measured (goodput and interval) or failed (reason and log)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    label: str
    params: dict[str, bool | int | float | str | None]
    baseline: bool = False
    order: int = Field(ge=0, description="position in the order candidates were measured")
    status: Literal["measured", "failed"]
    goodput_rps: float | None = None
    interval: Interval | None = None
    search_status: str | None = None
    """The SLO search's: bounded, below-range (missed at the low end) or above-range (held at the top)."""
    predicted_rps: float | None = None
    """The planner's simulated goodput when it ranked the candidate (None: no model)."""
    run_ids: list[str] = Field(default_factory=list)
    held_run_id: str | None = None
    ttft_p95_ms: float | None = None
    """p95 TTFT of the run at the highest rate that held."""
    devices: int = Field(1, ge=1)
    reason: str | None = None
    log: str | None = None
    wall_s: float = 0.0
    measured_at: float = Field(default_factory=time.time)


class TuneStoreData(BaseModel):
    """The file's content."""

    model_config = ConfigDict(extra="forbid")

    version: int
    fingerprint: str
    study: dict[str, object]
    candidates: list[CandidateRecord] = Field(default_factory=list)
    elapsed_s: float = 0.0


class TuneStore:
    """Open (or create) the store of one tune directory; `record` adds a candidate and saves."""

    def __init__(self, directory: Path, fingerprint: str, study: dict[str, object], *, restart: bool = False) -> None:
        self.directory = directory
        self.path = directory / STORE_FILE
        existing = None if restart else read_store(self.path)
        if existing is not None and existing.fingerprint != fingerprint:
            raise UserError(
                f"{self.path}: holds a different tune (other spec, flags, workload or SLO); "
                "use another --out, or --restart to forget it"
            )
        self.data = existing or TuneStoreData(version=STORE_VERSION, fingerprint=fingerprint, study=study)
        if existing is None:
            self.save()

    @property
    def records(self) -> list[CandidateRecord]:
        return list(self.data.candidates)

    def finished(self, candidate_id: str) -> CandidateRecord | None:
        return next((record for record in self.data.candidates if record.id == candidate_id), None)

    def record(self, record: CandidateRecord) -> None:
        """Add (or replace) one candidate's outcome and write the file."""
        self.data.candidates = [item for item in self.data.candidates if item.id != record.id] + [record]
        self.save()

    def add_elapsed(self, seconds: float) -> None:
        self.data.elapsed_s += seconds
        self.save()

    def save(self) -> None:
        """Write to a temporary file and rename it over the store: the old or the new, never half."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{STORE_FILE}.{os.getpid()}.tmp")
            temporary.write_text(self.data.model_dump_json(indent=2) + "\n", encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError as err:
            raise UserError(
                f"{self.path}: cannot write the tune store ({err.strerror or type(err).__name__}); "
                "check the directory's permissions and free space"
            ) from None


def read_store(path: Path) -> TuneStoreData | None:
    """The store at `path`, None when there is none, one line when the file is not a tune store."""
    if not path.exists():
        return None
    advice = "remove it, or pass --restart to start the tune over"
    try:
        data = loads_json(read_bytes(path, CONFIG_FILE), CONFIG_FILE)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, Refused) as err:
        why = "not readable JSON" if not isinstance(err, Refused) else str(err)
        raise UserError(f"{path}: not a tune store ({why}); {advice}") from None
    try:
        store = TuneStoreData.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise UserError(f"{path}: not a tune store (field '{where}': {first['msg']}); {advice}") from None
    if store.version != STORE_VERSION:
        raise UserError(f"{path}: a tune store of version {store.version}, this vlmserve reads {STORE_VERSION}; {advice}")
    return store
