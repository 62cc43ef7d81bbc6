"""RunResult: what one bench run (measured or simulated) hands to reports, sweeps and the store."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vlmserve.results.blocks import RunMeta
from vlmserve.results.records import RequestRecord
from vlmserve.results.summary import RunSummary


@dataclass
class RunResult:
    """The records of one run and its summary (the `--json-out` document).

    `summary` carries `meta` (run_id, label, target, model, server_version, load spec,
    deployment spec, started_at, simulated), the figures from `metrics.summarize`,
    `client` (send lag, CPU, `limited`), `server` (scraped /metrics deltas) and `warnings`
    (post-run steps that failed: the figures are complete, something around them is not).
    """

    records: list[RequestRecord]
    summary: RunSummary
    extras: dict[str, object] = field(default_factory=dict)
    """Anything a producer wants to keep alongside (not persisted by the store)."""

    @property
    def meta(self) -> RunMeta:
        return self.summary.meta

    @property
    def warnings(self) -> list[str]:
        """Post-run steps that failed (see `bench.post_run`); empty when everything was written."""
        if self.summary.warnings is None:
            self.summary.warnings = []
        return self.summary.warnings

    @property
    def run_id(self) -> str | None:
        return self.meta.run_id

    @property
    def simulated(self) -> bool:
        return self.summary.simulated

    @property
    def client_limited(self) -> bool:
        return self.summary.client_limited

    def to_json(self) -> str:
        return json.dumps(self.summary.to_dict(), indent=2, sort_keys=False, default=str)

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")
