"""What a finished (or partly finished) sweep holds: one outcome per deployment × cell.

Reports, knee detection, ranking and compare all read this one shape. A single bench
run is shown through the same shape (one deployment, one cell), so `vlmserve report`
and `vlmserve compare` accept a run id or a sweep alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vlmserve.json_types import JSONObject
from vlmserve.results.summary import RunSummary, figure_value
from vlmserve.spec import SLO

SIMULATED_NOTE = "Figures from the simulated engine or the planner are simulated, not measured on the named hardware."

LOAD_LEVEL_FIELDS = ("concurrency", "rate")
"""LoadSpec fields that say how hard a cell pushes; cells differing only in these form a series."""

_NOT_SERIES_FIELDS = {
    "name",
    "concurrency",
    "rate",
    "num_requests",
    "duration_s",
    "seed",
    "warmup",
    "workers",
    "request_timeout_s",
    "repeat",
    "stop_when_oversaturated",
}


@dataclass
class CellOutcome:
    """One deployment × cell: its summary when it ran, its reason when it did not."""

    deployment: str
    cell: str
    load: JSONObject
    status: str
    """'done', 'failed' or 'pending'."""
    run_id: str | None = None
    summary: RunSummary | None = None
    reason: str | None = None
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done" and self.summary is not None

    @property
    def load_level(self) -> float | None:
        """Concurrency (closed loop) or rate (open loop): the x axis of every load plot."""
        for key in LOAD_LEVEL_FIELDS:
            value = self.load.get(key)
            if isinstance(value, (int, float, str)):
                return float(value)
        return None

    @property
    def load_level_name(self) -> str:
        return "concurrency" if self.load.get("concurrency") is not None else "rate"

    @property
    def workload_shape(self) -> str:
        """What each request is (dataset, lengths, reuse), apart from how hard and how long it is sent.

        Figures compare only within one shape: 128-token prompts always beat 2048-token ones.
        """
        shape = {key: value for key, value in sorted(self.load.items()) if key not in _NOT_SERIES_FIELDS}
        return json.dumps(shape, sort_keys=True, default=str)

    @property
    def series_key(self) -> str:
        """Cells of one deployment that differ only in load level belong to one curve."""
        return self.deployment + " " + self.workload_shape

    @property
    def workload_text(self) -> str:
        """What a cell sends, in a few words: 'random 512→64', 'sharegpt', 'images 1×64×64', plus explicit reuse and features."""
        load = self.load
        dataset = str(load.get("dataset", "random"))
        if dataset == "random":
            text = f"random {load.get('input_len')}→{load.get('output_len')}"
        elif dataset == "images":
            given = load.get("image_size")
            size = given if isinstance(given, list) and len(given) == 2 else ["?", "?"]
            text = f"images {load.get('images_per_request', 1)}×{size[0]}×{size[1]}"
        else:
            text = dataset
        if load.get("prompt_pool_size"):
            text += f" pool {load['prompt_pool_size']}"
        if load.get("shared_prefix_len"):
            text += f" shared prefix {load['shared_prefix_len']}"
        features = load.get("features")
        if isinstance(features, list) and features:
            text += " + " + ",".join(str(feature) for feature in features)
        return text

    @property
    def client_limited(self) -> bool:
        """True when the load generator, not the server, set the pace (the numbers understate the server)."""
        return self.summary is not None and self.summary.client_limited

    def metric(self, name: str) -> float | None:
        """The figure `name` (results.summary.FIGURES) of this cell; None when it did not run."""
        return figure_value(self.summary, name)


@dataclass
class DeploymentInfo:
    """What a deployment was: its spec, where it ran, the versions it reported."""

    name: str
    kind: str
    """'managed' (vlmserve started it) or 'endpoint'."""
    devices: float
    usd_per_gpu_hour: float | None = None
    spec: JSONObject | None = None
    endpoint: str | None = None
    model: str | None = None
    status: str = "pending"
    reason: str | None = None
    server_version: str | None = None


@dataclass
class SweepResults:
    """Everything a report needs: deployments, outcomes, the SLOs and knee settings."""

    name: str
    deployments: list[DeploymentInfo]
    cells: list[CellOutcome]
    slo: SLO = field(default_factory=SLO)
    knee_min_gain_fraction: float = 0.5
    source: str = ""
    """A sweep directory or a run id."""
    description: str | None = None
    notes: list[str] = field(default_factory=list)

    def all_notes(self) -> list[str]:
        """The sweep's notes, then every cell's run warnings (e.g. a prefix-cache hit rate above intent)."""
        warnings = [
            f"{cell.deployment}/{cell.cell}: {warning}"
            for cell in self.cells
            if cell.ok
            for warning in (cell.summary.warnings if cell.summary is not None else None) or []
        ]
        return [*self.notes, *warnings]

    """Caveats a reader must see first (e.g. the sweep was shrunk for a smoke run)."""

    def simulated(self) -> bool:
        """True when any figure came from the simulated engine or the planner (they must say so)."""
        if any(cell.summary is not None and cell.ok and cell.summary.simulated for cell in self.cells):
            return True
        return any((info.spec or {}).get("engine") == "sim" for info in self.deployments)

    def cells_of(self, deployment: str) -> list[CellOutcome]:
        return [cell for cell in self.cells if cell.deployment == deployment]

    def deployment(self, name: str) -> DeploymentInfo:
        for info in self.deployments:
            if info.name == name:
                return info
        raise KeyError(name)

    def counts(self) -> tuple[int, int]:
        """(succeeded, total) cells."""
        return sum(1 for cell in self.cells if cell.ok), len(self.cells)

    def failures(self) -> list[CellOutcome]:
        return [cell for cell in self.cells if cell.status == "failed"]

    def outcome_line(self) -> str:
        """'14 of 15 succeeded; the image cell failed: <reason>' — the sentence a ticket needs."""
        done, total = self.counts()
        line = f"{done} of {total} cells succeeded"
        failed = self.failures()
        failed_deployments = [info for info in self.deployments if info.status == "failed"]
        parts: list[str] = []
        for info in failed_deployments:
            parts.append(f"deployment {info.name} failed: {info.reason}")
        for cell in failed:
            if any(cell.deployment == info.name for info in failed_deployments):
                continue
            parts.append(f"the {cell.cell} cell on {cell.deployment} failed: {cell.reason}")
        pending = sum(1 for cell in self.cells if cell.status == "pending")
        if pending:
            parts.append(f"{pending} not run yet")
        return line + ("; " + "; ".join(parts) if parts else "")
