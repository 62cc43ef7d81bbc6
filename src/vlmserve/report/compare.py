"""`vlmserve compare BASELINE CANDIDATE`: the same cells side by side, as ratios, with regressions flagged.

Ratios are written the way people say them ("TTFT p50 5.6× lower", "throughput 5.7× higher").
A change counts as a regression only when it is worse than the noise threshold (default 10%),
so run-to-run jitter does not fail a CI job.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table as RichTable

from vlmserve.errors import UserError
from vlmserve.report.tables import fmt, level_label
from vlmserve.sweep.results import CellOutcome, SweepResults


@dataclass(frozen=True)
class ComparedMetric:
    """One metric as a display name, a summary path and which direction is better."""

    label: str
    path: str
    lower_is_better: bool


COMPARED_METRICS: tuple[ComparedMetric, ...] = (
    ComparedMetric("TTFT p50", "ttft_ms.p50", True),
    ComparedMetric("TTFT p95", "ttft_ms.p95", True),
    ComparedMetric("TTFT p99", "ttft_ms.p99", True),
    ComparedMetric("TPOT p50", "tpot_ms.p50", True),
    ComparedMetric("ITL p95", "itl_ms.p95", True),
    ComparedMetric("E2E p95", "e2e_ms.p95", True),
    ComparedMetric("throughput", "throughput.output_tokens_per_s", False),
    ComparedMetric("requests/s", "throughput.requests_per_s", False),
)

FAILED_FRACTION_TOLERANCE = 0.01
"""A candidate failing more than 1 point more of its requests is a regression, whatever the threshold."""


@dataclass(frozen=True)
class MetricChange:
    """Baseline and candidate values of one metric in one cell, and how to read the change."""

    cell: str
    metric: ComparedMetric
    baseline: float
    candidate: float

    @property
    def ratio(self) -> float:
        """candidate / baseline (inf when the baseline is 0)."""
        return self.candidate / self.baseline if self.baseline else float("inf")

    @property
    def worse_by(self) -> float:
        """Relative change in the bad direction (negative when the candidate is better)."""
        if self.metric.lower_is_better:
            return self.ratio - 1.0
        return (1.0 / self.ratio - 1.0) if self.candidate else float("inf")

    def phrase(self) -> str:
        """'5.6× lower' / '12% higher' / 'unchanged'."""
        if self.baseline == self.candidate:
            return "unchanged"
        if self.baseline <= 0 or self.candidate <= 0:
            return f"{self.baseline:g} → {self.candidate:g}"
        factor = max(self.ratio, 1.0 / self.ratio)
        direction = "higher" if self.candidate > self.baseline else "lower"
        if factor < 1.5:
            return f"{abs(self.ratio - 1.0):.0%} {direction}"
        return f"{factor:.1f}× {direction}"

    def is_regression(self, threshold: float) -> bool:
        return self.worse_by > threshold


@dataclass
class CellComparison:
    """One matched cell: its metric changes and any failure-rate regression."""

    name: str
    level: str
    changes: list[MetricChange]
    failed_fraction: tuple[float, float]
    load_differences: list[str]
    """How the two runs' loads differ (e.g. 'output_len 8 → 128'): a ratio across different loads misleads."""


@dataclass
class Comparison:
    baseline: SweepResults
    candidate: SweepResults
    threshold: float
    cells: list[CellComparison]
    unmatched: list[str]

    def regressions(self) -> list[str]:
        """Every regression as one line, e.g. 'in256-c4: TTFT p95 34% higher (threshold 10%)'."""
        found: list[str] = []
        for cell in self.cells:
            for change in cell.changes:
                if change.is_regression(self.threshold):
                    found.append(f"{cell.name}: {change.metric.label} {change.phrase()} "
                                 f"({fmt(change.baseline, 2)} → {fmt(change.candidate, 2)}; "
                                 f"threshold {self.threshold:.0%})")
            base_failed, cand_failed = cell.failed_fraction
            if cand_failed - base_failed > FAILED_FRACTION_TOLERANCE:
                found.append(f"{cell.name}: failed requests {base_failed:.1%} → {cand_failed:.1%}")
        return found

    def headlines(self) -> list[str]:
        """The sentences for a ticket: 'TTFT p50 5.6× lower at 4 users'."""
        lines: list[str] = []
        for cell in self.cells:
            where = f" at {cell.level}" if len(self.cells) > 1 and cell.level != "—" else ""
            where = where or (f" ({cell.name})" if len(self.cells) > 1 else "")
            for change in cell.changes:
                if change.metric.path in ("ttft_ms.p50", "throughput.output_tokens_per_s", "ttft_ms.p95"):
                    lines.append(f"{change.metric.label} {change.phrase()}{where}")
        return lines


_LOAD_KEYS_IGNORED = {"name", "seed", "workers", "tokenizer", "request_timeout_s", "num_requests", "duration_s",
                      "warmup"}


def load_differences(baseline: dict, candidate: dict) -> list[str]:
    """What differs in the workload itself (not its length or client plumbing) between two cells."""
    keys = sorted((set(baseline) | set(candidate)) - _LOAD_KEYS_IGNORED)
    return [f"{key} {baseline.get(key)} → {candidate.get(key)}" for key in keys
            if baseline.get(key) != candidate.get(key)]


def _failed_fraction(cell: CellOutcome) -> float:
    completed = cell.metric("requests.completed") or 0.0
    failed = cell.metric("requests.failed") or 0.0
    return failed / (completed + failed) if completed + failed else 0.0


def match_cells(baseline: SweepResults, candidate: SweepResults) -> tuple[list[tuple[str, CellOutcome, CellOutcome]], list[str]]:
    """Pairs of cells that measured the same thing: same deployment and cell name, else same cell name.

    Two single runs always pair up. Returns (pairs, names of cells only one side has).
    """
    base_ok = [cell for cell in baseline.cells if cell.ok]
    cand_ok = [cell for cell in candidate.cells if cell.ok]
    if len(base_ok) == 1 and len(cand_ok) == 1 and len(baseline.cells) == 1 and len(candidate.cells) == 1:
        return [(cand_ok[0].cell, base_ok[0], cand_ok[0])], []
    by_full = {(cell.deployment, cell.cell): cell for cell in base_ok}
    pairs = [(f"{cell.deployment}/{cell.cell}", by_full[(cell.deployment, cell.cell)], cell)
             for cell in cand_ok if (cell.deployment, cell.cell) in by_full]
    if not pairs:
        by_name: dict[str, CellOutcome] = {}
        for cell in base_ok:
            by_name.setdefault(cell.cell, cell)
        pairs = [(cell.cell, by_name[cell.cell], cell) for cell in cand_ok if cell.cell in by_name]
    paired = {id(cell) for _, base, cand in pairs for cell in (base, cand)}
    unmatched = sorted({f"{cell.deployment}/{cell.cell}" for cell in base_ok + cand_ok if id(cell) not in paired})
    return pairs, unmatched


def compare(baseline: SweepResults, candidate: SweepResults, threshold: float = 0.10) -> Comparison:
    """Compare every matching cell; raise a clear error when nothing matches."""
    if threshold < 0:
        raise UserError("--threshold must be zero or positive, e.g. 0.1 for 10%")
    pairs, unmatched = match_cells(baseline, candidate)
    if not pairs:
        raise UserError(
            f"{baseline.source} and {candidate.source} have no finished cells in common; "
            "compare runs or sweeps that used the same cell names"
        )
    cells: list[CellComparison] = []
    for name, base, cand in pairs:
        changes = []
        for metric in COMPARED_METRICS:
            before, after = base.metric(metric.path), cand.metric(metric.path)
            if before is not None and after is not None:
                changes.append(MetricChange(name, metric, before, after))
        cells.append(CellComparison(name, level_label(cand), changes, (_failed_fraction(base), _failed_fraction(cand)),
                                    load_differences(base.load, cand.load)))
    return Comparison(baseline, candidate, threshold, cells, unmatched)


def print_comparison(comparison: Comparison, console: Console) -> None:
    """A table per matched cell, the headline ratios, then the regressions."""
    console.print(f"[bold]baseline[/] {comparison.baseline.source}  vs  [bold]candidate[/] {comparison.candidate.source}")
    for cell in comparison.cells:
        table = RichTable(title=f"{cell.name} ({cell.level})", title_justify="left")
        for column in ("metric", "baseline", "candidate", "candidate vs baseline", "verdict"):
            table.add_column(column)
        for change in cell.changes:
            regression = change.is_regression(comparison.threshold)
            better = change.worse_by < -comparison.threshold
            verdict = "[red]REGRESSION[/]" if regression else ("[green]better[/]" if better else "within noise")
            table.add_row(change.metric.label, fmt(change.baseline, 2), fmt(change.candidate, 2), change.phrase(),
                          verdict)
        console.print(table)
        if cell.load_differences:
            console.print(f"[yellow]  ⚠ the loads differ ({'; '.join(cell.load_differences)}): "
                          "these ratios compare different workloads[/]")
    for line in comparison.headlines():
        console.print(f"• {line}")
    if comparison.unmatched:
        console.print(f"[yellow]not compared (only on one side):[/] {', '.join(comparison.unmatched)}")
    regressions = comparison.regressions()
    if regressions:
        console.print(f"[red bold]{len(regressions)} regression(s) beyond the {comparison.threshold:.0%} noise threshold:[/]")
        for line in regressions:
            console.print(f"[red]  ✗ {line}[/]")
    else:
        console.print(f"[green]no regression beyond the {comparison.threshold:.0%} noise threshold[/]")
