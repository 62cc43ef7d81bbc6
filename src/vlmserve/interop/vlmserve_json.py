"""vlmserve's own `bench --json-out` summary, read back (from another machine, a CI artifact, a colleague).

The file is the summary document `RunResult.to_json` writes: `meta`, `requests`, `throughput`
and the latency blocks. It holds no per-request records (those go to `--records-out`), so an
imported run has the figures but no CDF or timeline. The file's `meta` is kept as written:
model, label, load, and `simulated` (bench sets it when the endpoint was a sim engine).
"""

from __future__ import annotations

from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.results.blocks import RunMeta
from vlmserve.results.run import RunResult
from vlmserve.results.summary import RunSummary

TOOL = "vlmserve"

REQUIRED_KEYS = ("meta", "requests", "throughput", "ttft_ms")
"""Blocks every `--json-out` summary has."""


def looks_like_vlmserve_summary(data: JSONValue) -> bool:
    return isinstance(data, dict) and all(isinstance(data.get(key), dict) for key in REQUIRED_KEYS)


def from_vlmserve_summary(data: JSONObject) -> RunResult:
    """The summary as a RunResult without records; its run id is dropped so the store gives a fresh one."""
    summary = RunSummary.model_validate(data)
    kept = summary.meta.model_dump(exclude_unset=True, exclude={"run_id"})  # the store gives it a fresh id
    summary.meta = RunMeta.model_validate(
        {**kept, "original_run_id": summary.meta.run_id, "tool": TOOL, "simulated": summary.meta.simulated}
    )
    return RunResult(records=[], summary=summary)
