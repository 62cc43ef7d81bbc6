"""Turn what the user names (a sweep directory, a sweep name or a stored run id) into SweepResults.

Reports and comparisons read one shape; a single bench run is shown as a sweep with one
deployment and one cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vlmserve import paths
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.results.blocks import RunMeta
from vlmserve.results.summary import read_summary
from vlmserve.sweep.manifest import SweepManifest
from vlmserve.sweep.results import CellOutcome, DeploymentInfo, SweepResults
from vlmserve.sweep.spec import SweepSpec


def default_sweep_dir(name: str) -> Path:
    """$VLMSERVE_HOME/sweeps/<name>, beside the run store (vlmserve.paths.sweep_dir)."""
    return paths.sweep_dir(name)


def results_from_sweep_dir(directory: Path) -> SweepResults:
    """Read a sweep directory's spec and manifest (finished, failed and not-yet-run cells)."""
    manifest = SweepManifest.load(directory)
    spec = SweepSpec.model_validate(manifest.spec_json())
    deployments: list[DeploymentInfo] = []
    for entry in spec.deployments:
        state = manifest.deployment(entry.name)
        deployments.append(
            DeploymentInfo(
                name=entry.name,
                kind="managed" if entry.managed else "endpoint",
                devices=entry.device_count(),
                usd_per_gpu_hour=entry.usd_per_gpu_hour,
                spec=entry.spec.model_dump(mode="json") if entry.spec else None,
                endpoint=entry.endpoint or state.get("base_url"),
                model=entry.served_model(),
                status=str(state.get("status", "pending")),
                reason=state.get("reason"),
                server_version=state.get("server_version") or _version_from_runs(manifest, entry.name),
            )
        )
    cells: list[CellOutcome] = []
    for entry in spec.deployments:
        for cell in spec.cells:
            cell_state = manifest.cell(entry.name, cell.name)
            cells.append(
                CellOutcome(
                    deployment=entry.name,
                    cell=cell.name,
                    load=cell.load.model_dump(mode="json"),
                    status=str(cell_state.get("status", "pending")),
                    run_id=cell_state.get("run_id"),
                    summary=read_summary(cell_state["summary"], f"{directory}: cell {entry.name}/{cell.name}")
                    if cell_state.get("summary")
                    else None,
                    reason=cell_state.get("reason"),
                    wall_s=cell_state.get("wall_s"),
                )
            )
    return SweepResults(
        name=spec.name,
        deployments=deployments,
        cells=cells,
        slo=spec.slo,
        knee_min_gain_fraction=spec.knee.min_gain_fraction,
        source=str(directory),
        description=spec.description,
        notes=_override_notes(manifest.data.get("overrides") or {}),
    )


def _version_from_runs(manifest: SweepManifest, deployment: str) -> str | None:
    """The server version bench recorded with a finished cell (gateways may not answer /version)."""
    for key, cell in manifest.data.get("cells", {}).items():
        stored = cell.get("summary")  # done cells only
        if key.startswith(f"{deployment}/") and stored is not None:
            version = read_summary(stored, f"the sweep manifest's cell {key}").meta.server_version
            if version:
                return version
    return None


def _override_notes(overrides: Mapping[str, object]) -> list[str]:
    """Say plainly when a sweep ran shrunk, so nobody quotes a smoke run as the study."""
    parts = []
    if overrides.get("request_scale", 1.0) != 1.0:
        parts.append(f"request counts and durations ×{overrides['request_scale']:g}")
    if overrides.get("user_scale", 1.0) != 1.0:
        parts.append(f"users and rates ×{overrides['user_scale']:g}")
    if overrides.get("requests_per_user"):
        parts.append(f"{overrides['requests_per_user']} requests per user (counts and durations replaced)")
    if overrides.get("max_output_len"):
        parts.append(f"outputs capped at {overrides['max_output_len']} tokens")
    patterns = overrides.get("cell_patterns")
    if patterns and isinstance(patterns, (list, tuple)):
        parts.append(f"only cells {', '.join(map(str, patterns))}")
    return [f"shrunk run ({'; '.join(parts)}): not the full study"] if parts else []


def results_from_run(run_id: str) -> SweepResults:
    """A stored bench run as a one-cell sweep."""
    from vlmserve.results import store

    missing = (
        f"no stored run or sweep named '{run_id}'; give a run id (see `vlmserve runs list`), a sweep directory or a sweep name"
    )
    if not store.database_path().exists():
        raise UserError(missing)
    try:
        result = store.load_run(run_id)
    except UserError as err:
        raise UserError(missing if err.message.startswith("no run") else err.message) from None
    summary = result.summary
    meta = summary.meta
    load = meta.load_spec or {}
    deployment_spec = meta.deployment
    label = meta.label or run_id
    name = (deployment_spec or {}).get("name")
    deployment_name = str(name or meta.target or "endpoint")
    from vlmserve.spec import SLO

    info = DeploymentInfo(
        name=deployment_name,
        kind="managed" if deployment_spec else "endpoint",
        devices=float(_devices(deployment_spec)),
        spec=deployment_spec,
        endpoint=meta.target,
        model=meta.model,
        status="done",
        server_version=meta.server_version,
    )
    cell = CellOutcome(
        deployment=deployment_name, cell=label, load=load, status="done", run_id=meta.run_id or run_id, summary=summary
    )
    return SweepResults(
        name=label, deployments=[info], cells=[cell], slo=SLO(bounds_s=meta.slo or {}), source=run_id, notes=_import_notes(meta)
    )


def _import_notes(meta: RunMeta) -> list[str]:
    """For a run `runs import` stored: which tool made it, so the page says whose figures these are
    (the import's warnings, like any run's, follow in `all_notes`)."""
    if not meta.tool:
        return []
    version = f" {meta.tool_version}" if meta.tool_version else ""
    origin = f" ({meta.imported_from})" if meta.imported_from else ""
    tool = meta.tool
    return [f"imported from {tool}{version}{origin}; figures the file lacks are unknown (shown as —)"]


def _devices(deployment_spec: JSONObject | None) -> int:
    """GPUs a deployment spec asks for: replicas × tensor parallel (1 where it does not say)."""
    if deployment_spec is None:
        return 1
    replicas = deployment_spec.get("replicas")
    engine_args = deployment_spec.get("engine_args")
    tp = engine_args.get("tensor_parallel_size") if isinstance(engine_args, dict) else None
    return (replicas if isinstance(replicas, int) and replicas > 0 else 1) * (tp if isinstance(tp, int) and tp > 0 else 1)


def load_source(name: str) -> SweepResults:
    """Resolve RUN_OR_SWEEP: a sweep directory, a sweep name under $VLMSERVE_HOME/sweeps, or a run id."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not SweepManifest.is_sweep_dir(path):
            raise UserError(
                f"{path} is a directory but not a sweep directory (no manifest.json); give a sweep directory or a run id"
            )
        return results_from_sweep_dir(path)
    named = default_sweep_dir(name) if "/" not in name else None
    if named is not None and SweepManifest.is_sweep_dir(named):
        return results_from_sweep_dir(named)
    return results_from_run(name)
