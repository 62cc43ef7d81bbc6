"""The sweep directory: which cells finished, which failed and why — the state that makes a sweep resumable.

Layout of a sweep directory:
  spec.json      the validated sweep spec (with the overrides applied) it was started with
  manifest.json  one entry per deployment and per deployment/cell: status, run id, reason
  report.html    written at the end (and by `vlmserve report DIR`)

The manifest is rewritten atomically after every cell, so Ctrl-C, a crash or a killed
machine never loses a finished cell. Each finished cell's run lives in the run store
(DuckDB + Parquet) under its run id; the manifest keeps a copy of its summary so a report
still works when the sweep directory is moved to another machine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, Unpack

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.results.summary import RunSummary

MANIFEST_NAME = "manifest.json"
SPEC_NAME = "spec.json"
FORMAT_VERSION = 1


class CellState(TypedDict, total=False):
    """A cell's entry in manifest.json (absent: pending)."""

    status: str  # pending, done or failed
    run_id: str | None
    summary: JSONObject  # a copy of the stored run's summary (done cells)
    reason: str  # why it failed
    wall_s: float
    finished_at: float


class DeploymentFacts(TypedDict, total=False):
    """What the runner learns of a deployment once it serves."""

    base_url: str
    server_version: str | None
    start_s: float


class DeploymentState(DeploymentFacts, total=False):
    """A deployment's entry in manifest.json (absent: pending)."""

    status: str  # pending, running, done, partial or failed
    reason: str | None


class ManifestData(TypedDict, total=False):
    """manifest.json as this module writes it."""

    format: int
    name: str
    fingerprint: str
    created_at: float
    updated_at: float
    overrides: dict[str, object]  # the SweepOverrides it ran with (empty: the full study)
    deployments: dict[str, DeploymentState]
    cells: dict[str, CellState]


def cell_key(deployment: str, cell: str) -> str:
    return f"{deployment}/{cell}"


def _write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    temp = path.with_suffix(path.suffix + ".tmp")
    temp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(temp, path)


class SweepManifest:
    """Read and update one sweep directory's manifest; every update is flushed to disk at once."""

    def __init__(self, directory: Path, data: ManifestData) -> None:
        self.directory = directory
        self.data = data

    @property
    def path(self) -> Path:
        return self.directory / MANIFEST_NAME

    @classmethod
    def is_sweep_dir(cls, directory: Path) -> bool:
        return (directory / MANIFEST_NAME).is_file() and (directory / SPEC_NAME).is_file()

    @classmethod
    def open_for_run(
        cls,
        directory: Path,
        name: str,
        fingerprint: str,
        spec_json: JSONObject,
        restart: bool,
        overrides: Mapping[str, object] | None = None,
    ) -> "SweepManifest":
        """Create the directory, or reopen it to resume the same study (refusing a different one)."""
        directory.mkdir(parents=True, exist_ok=True)
        if cls.is_sweep_dir(directory) and not restart:
            manifest = cls.load(directory)
            if manifest.data.get("fingerprint") != fingerprint:
                raise UserError(
                    f"{directory} holds a different sweep (the spec or the overrides changed); "
                    "pass --restart to start it over or --out NEW_DIR to keep both"
                )
            return manifest
        data: ManifestData = {
            "format": FORMAT_VERSION,
            "name": name,
            "fingerprint": fingerprint,
            "created_at": time.time(),
            "overrides": dict(overrides or {}),
            "deployments": {},
            "cells": {},
        }
        _write_json_atomic(directory / SPEC_NAME, spec_json)
        manifest = cls(directory, data)
        manifest.flush()
        return manifest

    @classmethod
    def load(cls, directory: Path) -> "SweepManifest":
        try:
            data = json.loads((directory / MANIFEST_NAME).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(f"{directory}: cannot read {MANIFEST_NAME} ({err}); is this a sweep directory?") from None
        return cls(directory, data)

    def spec_json(self) -> JSONObject:
        return json.loads((self.directory / SPEC_NAME).read_text())

    def flush(self) -> None:
        self.data["updated_at"] = time.time()
        _write_json_atomic(self.path, self.data)

    # cells -----------------------------------------------------------------------------------
    def cell(self, deployment: str, cell: str) -> CellState:
        return self.data.get("cells", {}).get(cell_key(deployment, cell), {"status": "pending"})

    def is_done(self, deployment: str, cell: str) -> bool:
        return self.cell(deployment, cell).get("status") == "done"

    def record_cell_done(self, deployment: str, cell: str, run_id: str, summary: RunSummary, wall_s: float) -> None:
        self.data.setdefault("cells", {})[cell_key(deployment, cell)] = {
            "status": "done",
            "run_id": run_id,
            "summary": summary.to_dict(),
            "wall_s": wall_s,
            "finished_at": time.time(),
        }
        self.flush()

    def record_cell_failed(self, deployment: str, cell: str, reason: str, wall_s: float = 0.0, run_id: str | None = None) -> None:
        self.data.setdefault("cells", {})[cell_key(deployment, cell)] = {
            "status": "failed",
            "reason": reason,
            "run_id": run_id,
            "wall_s": wall_s,
            "finished_at": time.time(),
        }
        self.flush()

    # deployments -----------------------------------------------------------------------------
    def deployment(self, name: str) -> DeploymentState:
        return self.data.get("deployments", {}).get(name, {"status": "pending"})

    def record_deployment(self, name: str, status: str, reason: str | None = None, **facts: Unpack[DeploymentFacts]) -> None:
        entry: DeploymentState = {**self.deployment(name), "status": status, "reason": reason, **facts}
        self.data.setdefault("deployments", {})[name] = entry
        self.flush()
