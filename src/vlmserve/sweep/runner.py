"""Running a sweep: every deployment started fresh, verified, warmed up, driven through every cell, torn down.

A cell or a deployment that fails is recorded with its reason and the sweep goes on;
finished cells are written to the manifest (and their runs to the store) one by one, so a
rerun skips them and Ctrl-C never loses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.results.summary import RunSummary
from vlmserve.spec import LoadSpec
from vlmserve.sweep.hygiene import check_ports_free, server_version, verify_serving, with_free_ports
from vlmserve.sweep.manifest import SweepManifest
from vlmserve.sweep.spec import CellEntry, DeploymentEntry, SweepSpec

if TYPE_CHECKING:
    from vlmserve.results.run import RunResult


@dataclass(frozen=True)
class SweepOverrides:
    """Shrink a study without editing its YAML (smoke tests, CI): scale counts, durations and users."""

    request_scale: float = 1.0
    """Multiplies num_requests and duration_s."""
    user_scale: float = 1.0
    """Multiplies concurrency and rate."""
    max_output_len: int | None = None
    """Caps output_len."""
    cell_patterns: tuple[str, ...] = ()
    """Run only cells whose name matches one of these shell patterns (e.g. 'in512-*')."""
    requests_per_user: int | None = None
    """Replace each cell's count or duration by this many requests per user (per req/s for open loops)."""

    def apply(self, load: LoadSpec) -> LoadSpec:
        update: dict[str, int | float | None] = {}
        if self.request_scale != 1.0:
            if load.num_requests is not None:
                update["num_requests"] = max(1, round(load.num_requests * self.request_scale))
            if load.duration_s is not None:
                update["duration_s"] = max(0.5, load.duration_s * self.request_scale)
        if self.user_scale != 1.0:
            if load.concurrency is not None:
                update["concurrency"] = max(1, round(load.concurrency * self.user_scale))
            if load.rate is not None:
                update["rate"] = load.rate * self.user_scale
        if self.requests_per_user is not None:
            users = update.get("concurrency", load.concurrency) or math.ceil(update.get("rate", load.rate) or 1)
            update.update(num_requests=self.requests_per_user * users, duration_s=None)
        if self.max_output_len is not None and load.output_len > self.max_output_len:
            update["output_len"] = self.max_output_len
        return load.model_copy(update=update) if update else load


def apply_overrides(spec: SweepSpec, overrides: SweepOverrides) -> SweepSpec:
    """The spec actually run: the selected cells, each with the overrides applied."""
    chosen = spec.cells
    if overrides.cell_patterns:
        chosen = [
            cell for cell in spec.cells if any(fnmatch.fnmatchcase(cell.name, pattern) for pattern in overrides.cell_patterns)
        ]
        if not chosen:
            names = ", ".join(cell.name for cell in spec.cells)
            raise UserError(f"--cells {','.join(overrides.cell_patterns)} matches no cell; the spec has: {names}")
    cells = [CellEntry(name=cell.name, load=overrides.apply(cell.load)) for cell in chosen]
    return spec.model_copy(update={"cells": cells})


def one_line(err: BaseException, limit: int = 300) -> str:
    """An exception as one short line for the manifest and the report."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if not isinstance(err, UserError):
        text = f"{type(err).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failed_run_reason(result: "RunResult") -> str | None:
    """Why a run that produced no successful request counts as failed; None when some succeeded."""
    completed = sum(1 for record in result.records if record.ok and not record.warmup)
    if completed > 0:
        return None
    failures = [record for record in result.records if not record.ok and not record.warmup]
    if not failures:
        return "no requests were sent"
    kinds = Counter(record.error_kind or "error" for record in failures)
    kind, count = kinds.most_common(1)[0]
    example = next((record.error_message for record in failures if record.error_kind == kind), None) or ""
    example = example.strip().splitlines()[0][:200] if example.strip() else ""
    return f"all {len(failures)} requests failed ({kind} ×{count}){': ' + example if example else ''}"


@dataclasses.dataclass(frozen=True)
class ReadyDeployment:
    """Where a ready deployment answers, and the engine version its replicas reported at start."""

    base_url: str
    engine_version: str | None = None
    tokenizer: str | None = None
    """A local tokenizer directory for exact prompt lengths (gateways do not offer /tokenize)."""


@contextlib.contextmanager
def deployment_endpoint(entry: DeploymentEntry) -> Iterator[ReadyDeployment]:
    """Yield a ready deployment; a managed one is started fresh and always torn down."""
    if entry.endpoint is not None:
        yield ReadyDeployment(entry.endpoint)
        return
    assert entry.spec is not None
    check_ports_free(entry.spec)
    from vlmserve.deploy.supervisor import Supervisor

    with Supervisor(entry.spec) as supervisor:
        versions = [replica.served.engine_version for replica in supervisor.replicas if replica.served]
        model_dir = Path(supervisor.model_path)
        tokenizer = str(model_dir) if entry.spec.engine == "vllm" and model_dir.is_dir() else None
        yield ReadyDeployment(supervisor.endpoint.rstrip("/"), next((v for v in versions if v), None), tokenizer)


SWEEP_STOPS_WHEN_OVERSATURATED = True
"""A sweep cell's open loop stops early past saturation unless the cell sets stop_when_oversaturated."""


def _run_load(
    load: LoadSpec, base_url: str, model: str, spec: SweepSpec, label: str, deployment: JSONObject | None, console: Console
) -> "RunResult":
    """One cell: its repeats (LoadSpec.repeat) combined into one run, stopped early when oversaturated."""
    from vlmserve.bench.repeats import run_repeated
    from vlmserve.bench.target import Target

    slo = spec.slo if spec.slo.bounds_s or spec.slo.by_type or spec.slo.min_rates else None  # typed and rate objectives too
    if load.stop_when_oversaturated is None:
        load = load.model_copy(update={"stop_when_oversaturated": SWEEP_STOPS_WHEN_OVERSATURATED})
    return asyncio.run(
        run_repeated(
            load,
            Target(base_url=base_url, model=model),
            slo=slo,
            progress=False,
            label=label,
            deployment=deployment,
            console=console,
        )
    )


def _warmup_load(spec: SweepSpec) -> LoadSpec:
    """A few short requests so the first cell does not pay for compilation and cold caches."""
    return LoadSpec(
        name="warmup", concurrency=min(2, spec.warmup_requests), num_requests=spec.warmup_requests, input_len=64, output_len=8
    )


class SweepRunner:
    """Runs one sweep spec into one sweep directory, with a progress display."""

    def __init__(
        self,
        spec: SweepSpec,
        directory: Path,
        *,
        restart: bool = False,
        console: Console | None = None,
        progress: bool = True,
        overrides: SweepOverrides | None = None,
    ) -> None:
        self.spec = spec
        self.directory = directory
        self.console = console or Console(stderr=True)
        self.show_progress = progress
        self._attempted: set[str] = set()
        """Cells of the current deployment tried in this pass (their own outcome is already recorded)."""
        self.manifest = SweepManifest.open_for_run(
            directory,
            spec.name,
            spec.fingerprint(),
            spec.model_dump(mode="json"),
            restart,
            dataclasses.asdict(overrides) if overrides else None,
        )

    # ------------------------------------------------------------------------------------------
    def run(self) -> SweepManifest:
        """Run every unfinished cell; returns the manifest. Ctrl-C keeps every finished cell."""
        total = len(self.spec.cell_keys())
        done_before = sum(1 for dep, cell in self.spec.cell_keys() if self.manifest.is_done(dep, cell))
        if done_before:
            self.console.print(f"resuming {self.spec.name}: {done_before} of {total} cells already done")
        progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("cells"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.show_progress,
            speed_estimate_period=3600.0,
        )
        try:
            with progress:
                task = progress.add_task(self.spec.name, total=total, completed=done_before)
                for entry in self.spec.deployments:
                    self._run_deployment(entry, progress, task)
        except KeyboardInterrupt:
            kept = sum(1 for dep, cell in self.spec.cell_keys() if self.manifest.is_done(dep, cell))
            raise UserError(
                f"sweep interrupted; {kept} of {total} cells finished and kept in {self.directory}; "
                "rerun the same command to resume",
                exit_code=130,
            ) from None
        return self.manifest

    def _pending_cells(self, entry: DeploymentEntry) -> list[CellEntry]:
        return [cell for cell in self.spec.cells if not self.manifest.is_done(entry.name, cell.name)]

    def _run_deployment(self, entry: DeploymentEntry, progress: Progress, task: TaskID) -> None:
        pending = self._pending_cells(entry)
        if not pending:
            return
        if entry.managed and entry.spec is not None:
            try:
                entry = entry.model_copy(update={"spec": with_free_ports(entry.spec)})
            except UserError as err:
                self._fail_deployment(entry, pending, err.message, progress, task)
                return
        progress.update(task, description=f"{self.spec.name}: starting {entry.name}")
        started = time.monotonic()
        self._attempted = set()
        try:
            with deployment_endpoint(entry) as ready:
                base_url = ready.base_url
                max_len = entry.spec.engine_args.max_model_len if entry.spec else None
                verify_serving(base_url, entry.served_model(), max_len)
                version = server_version(base_url) or ready.engine_version
                self.manifest.record_deployment(
                    entry.name,
                    "running",
                    None,
                    base_url=base_url,
                    server_version=version,
                    start_s=round(time.monotonic() - started, 2),
                )
                if self.spec.warmup_requests:
                    progress.update(task, description=f"{self.spec.name}: warming up {entry.name}")
                    warm = _run_load(
                        _warmup_load(self.spec),
                        base_url,
                        entry.served_model(),
                        self.spec,
                        f"{self.spec.name}/{entry.name}/warmup",
                        None,
                        self.console,
                    )
                    reason = failed_run_reason(warm)
                    if reason:
                        raise UserError(f"warm-up failed: {reason}")
                for cell in pending:
                    if ready.tokenizer and cell.load.tokenizer is None:
                        cell = CellEntry(name=cell.name, load=cell.load.model_copy(update={"tokenizer": ready.tokenizer}))
                    self._run_cell(entry, cell, base_url, progress, task)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # a deployment that cannot start or serve: record it, go on
            reason = one_line(err)
            untried = [cell for cell in self._pending_cells(entry) if cell.name not in self._attempted]
            self._fail_deployment(entry, untried, reason, progress, task)
            return
        failed = sum(1 for cell in self.spec.cells if self.manifest.cell(entry.name, cell.name).get("status") == "failed")
        self.manifest.record_deployment(entry.name, "done" if failed == 0 else "partial", None)

    def _fail_deployment(
        self, entry: DeploymentEntry, cells: list[CellEntry], reason: str, progress: Progress, task: TaskID
    ) -> None:
        self.manifest.record_deployment(entry.name, "failed", reason)
        for cell in cells:
            self.manifest.record_cell_failed(entry.name, cell.name, f"deployment failed: {reason}")
            progress.advance(task)
        progress.console.print(f"[red]✗ {entry.name}[/]: deployment failed: {reason}")

    def _run_cell(self, entry: DeploymentEntry, cell: CellEntry, base_url: str, progress: Progress, task: TaskID) -> None:
        from vlmserve.results import store

        size = f"{cell.load.duration_s:g} s" if cell.load.duration_s is not None else f"{cell.load.num_requests} requests"
        progress.update(task, description=f"{self.spec.name}: {entry.name} / {cell.name} ({size})")
        self._attempted.add(cell.name)
        started = time.monotonic()
        deployment: JSONObject = entry.spec.model_dump(mode="json") if entry.spec else {"endpoint": entry.endpoint}
        try:
            load = cell.load.model_copy(update={"name": cell.name, "seed": _cell_seed(self.spec, cell)})
            result = _run_load(
                load,
                base_url,
                entry.served_model(),
                self.spec,
                f"{self.spec.name}/{entry.name}/{cell.name}",
                deployment,
                self.console,
            )
            run_id = store.save_run(result)
            wall = time.monotonic() - started
            reason = failed_run_reason(result)
            if reason:
                self.manifest.record_cell_failed(entry.name, cell.name, reason, wall, run_id)
                progress.console.print(f"[red]✗ {entry.name}/{cell.name}[/]: {reason}")
            else:
                self.manifest.record_cell_done(entry.name, cell.name, run_id, result.summary, wall)
                progress.console.print(f"[green]✓ {entry.name}/{cell.name}[/] {_cell_brief(result.summary)}")
        except KeyboardInterrupt:
            raise
        except Exception as err:  # one bad cell must not stop the study
            reason = one_line(err)
            self.manifest.record_cell_failed(entry.name, cell.name, reason, time.monotonic() - started)
            progress.console.print(f"[red]✗ {entry.name}/{cell.name}[/]: {reason}")
        progress.advance(task)


def _cell_seed(spec: SweepSpec, cell: CellEntry) -> int:
    """The cell's own seed unless it sets one: its position in the sweep, after the warm-up's 0.

    Cells run one after another against one engine; with one seed, a cell would send the
    prompts an earlier cell left in the prefix cache (the same seed draws the same prompts),
    and its TTFT would be flattered.
    """
    if "seed" in cell.load.model_fields_set:
        return cell.load.seed
    names = [entry.name for entry in spec.cells]
    return cell.load.seed + 1 + (names.index(cell.name) if cell.name in names else len(names))


def _cell_brief(summary: RunSummary) -> str:
    parts = []
    rps = summary.figure("throughput.requests_per_s")
    tok = summary.figure("throughput.output_tokens_per_s")
    ttft = summary.figure("ttft_ms.p50")
    if rps is not None:
        parts.append(f"{rps:.2f} req/s")
    if tok is not None:
        parts.append(f"{tok:.0f} tok/s")
    if ttft is not None:
        parts.append(f"TTFT p50 {ttft:.0f} ms")
    stopped = summary.meta.stopped
    if stopped:
        parts.append(f"stopped: {stopped}")
    return "  ".join(parts)


def run_sweep(
    spec: SweepSpec,
    directory: Path,
    *,
    overrides: SweepOverrides | None = None,
    restart: bool = False,
    progress: bool = True,
    console: Console | None = None,
) -> SweepManifest:
    """Run (or resume) `spec` into `directory`; the study's entry point for the CLI and tests."""
    overrides = overrides or SweepOverrides()
    effective = apply_overrides(spec, overrides)
    runner = SweepRunner(effective, directory, restart=restart, console=console, progress=progress, overrides=overrides)
    return runner.run()
