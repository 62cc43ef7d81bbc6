"""`vlmserve compare BASELINE CANDIDATE`: the same cells side by side, as ratios, with regressions flagged.

Ratios are written the way people say them ("TTFT p50 5.6× lower", "throughput 5.7× higher").
Repeated runs (`--repeat N` on both sides) are judged by their 95 % intervals and a minimum effect
(`--min-effect`), single runs by the noise threshold (`--threshold`); docs/sweep.md#compare gives
the rule and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

DEFAULT_THRESHOLD = 0.10
"""Single runs: a change worse than this fraction is a regression (`--threshold`)."""

DEFAULT_MIN_EFFECT = 0.05
"""Repeated runs: the smallest change that counts even when the intervals are apart (`--min-effect`)."""

FAILED_FRACTION_TOLERANCE = 0.01
"""A candidate failing more than 1 point more of its requests is a regression, whatever the threshold."""


@dataclass(frozen=True)
class MetricChange:
    """Baseline and candidate values of one metric in one cell, and how to read the change."""

    cell: str
    metric: ComparedMetric
    baseline: float
    candidate: float
    baseline_interval: tuple[float, float] | None = None
    candidate_interval: tuple[float, float] | None = None
    """95 % confidence intervals (low, high) of repeated runs; None for a single run."""

    @property
    def by_intervals(self) -> bool:
        """True when both sides have an interval, so the intervals (not the threshold) decide."""
        return self.baseline_interval is not None and self.candidate_interval is not None

    @property
    def intervals_overlap(self) -> bool:
        assert self.baseline_interval is not None and self.candidate_interval is not None
        return self.baseline_interval[0] <= self.candidate_interval[1] and self.candidate_interval[0] <= self.baseline_interval[1]

    def significant(self, min_effect: float) -> bool:
        """Repeated runs: intervals apart (statistically significant) and the means at least `min_effect` apart.

        The effect is |candidate / baseline − 1|, the figure the "12% higher" phrase shows.
        """
        return not self.intervals_overlap and abs(self.ratio - 1.0) >= min_effect

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

    def is_regression(self, threshold: float, min_effect: float) -> bool:
        if self.by_intervals:
            return self.significant(min_effect) and self.worse_by > 0
        return self.worse_by > threshold

    def is_improvement(self, threshold: float, min_effect: float) -> bool:
        if self.by_intervals:
            return self.significant(min_effect) and self.worse_by < 0
        return self.worse_by < -threshold

    def verdict(self, threshold: float, min_effect: float) -> str:
        """'regressed' / 'improved', else why not.

        Repeated runs: 'unchanged' (intervals overlap) or 'within 5%' (intervals apart, change below the
        minimum effect); single runs: 'within noise' (below the threshold).
        """
        if self.is_regression(threshold, min_effect):
            return "regressed"
        if self.is_improvement(threshold, min_effect):
            return "improved"
        if not self.by_intervals:
            return "within noise"
        return "unchanged" if self.intervals_overlap else f"within {min_effect:.0%}"


@dataclass
class CellComparison:
    """One matched cell: its metric changes and any failure-rate regression."""

    name: str
    level: str
    changes: list[MetricChange]
    failed_fraction: tuple[float, float]
    load_differences: list[str]
    """How the two runs' loads differ (e.g. 'output_len 8 → 128'): a ratio across different loads misleads."""
    repeats: tuple[int, int] = (1, 1)
    """Repeats behind the baseline and the candidate (1: a single run)."""
    unknown: list[str] = field(default_factory=list)
    """Metrics one side does not know (an imported file without them): 'TTFT p99 (unknown in baseline)'."""
    load_unknown: list[str] = field(default_factory=list)
    """Load settings one side's file does not record: shown apart, so the differences that matter stand out."""

    def judged_by(self, threshold: float, min_effect: float) -> str:
        """How this cell's changes are judged, in words."""
        if any(change.by_intervals for change in self.changes):
            return (
                f"judged by 95% confidence intervals ({self.repeats[0]} vs {self.repeats[1]} repeats), "
                f"min effect {min_effect:.0%}"
            )
        return f"single runs: judged by the {threshold:.0%} noise threshold (--repeat N on both gives confidence intervals)"


@dataclass
class Comparison:
    baseline: SweepResults
    candidate: SweepResults
    threshold: float
    cells: list[CellComparison]
    unmatched: list[str]
    min_effect: float

    def regressions(self) -> list[str]:
        """Every regression as one line, e.g. 'in256-c4: TTFT p95 34% higher (threshold 10%)'."""
        found: list[str] = []
        for cell in self.cells:
            for change in cell.changes:
                if change.is_regression(self.threshold, self.min_effect):
                    basis = (
                        f"95% intervals apart, at least {self.min_effect:.0%}"
                        if change.by_intervals
                        else f"single runs, threshold {self.threshold:.0%}"
                    )
                    found.append(
                        f"{cell.name}: {change.metric.label} {change.phrase()} "
                        f"({fmt(change.baseline, 2)} → {fmt(change.candidate, 2)}; {basis})"
                    )
            base_failed, cand_failed = cell.failed_fraction
            if cand_failed - base_failed > FAILED_FRACTION_TOLERANCE:
                found.append(f"{cell.name}: failed requests {base_failed:.1%} → {cand_failed:.1%}")
        return found

    def basis(self) -> str:
        """What a regression had to exceed: the intervals, the threshold, or both (mixed runs)."""
        by_intervals = [change.by_intervals for cell in self.cells for change in cell.changes]
        noise = f"the {self.threshold:.0%} noise threshold"
        intervals = f"the 95% confidence intervals and the {self.min_effect:.0%} minimum effect"
        if by_intervals and all(by_intervals):
            return intervals
        return f"{intervals}, or {noise}" if any(by_intervals) else noise

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


_LOAD_KEYS_IGNORED = {
    "name",
    "seed",
    "workers",
    "tokenizer",
    "request_timeout_s",
    "num_requests",
    "duration_s",
    "warmup",
    "repeat",
    "stop_when_oversaturated",
}


_LOAD_KEYS_NAMED = ("api", "dataset", "input_len", "output_len", "concurrency", "rate")
"""The load settings named when one side does not record them; the rest are only counted."""


def _loop(load: dict) -> str | None:
    """'closed loop, concurrency 4' / 'open loop, rate 12' / None when the load is not recorded."""
    if load.get("concurrency") is not None:
        return f"closed loop, concurrency {load['concurrency']}"
    if load.get("rate") is not None:
        return f"open loop, rate {load['rate']}"
    return None


def load_differences(baseline: dict, candidate: dict) -> list[str]:
    """What differs in the workload itself (not its length or client plumbing) between two cells.

    Only settings both sides record: one an imported file does not record is unknown, not a
    difference (`load_unknown`), or it would bury the difference that matters among 'X → None'.
    A closed loop against an open one is said first, as one difference.
    """
    found: list[str] = []
    base_loop, cand_loop = _loop(baseline), _loop(candidate)
    crossed = bool(base_loop and cand_loop and base_loop.split(",")[0] != cand_loop.split(",")[0])
    if crossed:
        found.append(f"{base_loop} → {cand_loop}")
    keys = sorted((set(baseline) | set(candidate)) - _LOAD_KEYS_IGNORED - ({"concurrency", "rate"} if crossed else set()))
    return found + [
        f"{key} {baseline[key]} → {candidate[key]}"
        for key in keys
        if baseline.get(key) is not None and candidate.get(key) is not None and baseline[key] != candidate[key]
    ]


def load_unknown(baseline: dict, candidate: dict) -> list[str]:
    """Load settings only one side records: the main ones by name ('input_len (unknown in candidate)'),
    the rest counted, so the line stays short."""
    base_loop, cand_loop = _loop(baseline), _loop(candidate)
    skip = {"concurrency", "rate"} if base_loop and cand_loop else set()
    keys = sorted((set(baseline) | set(candidate)) - _LOAD_KEYS_IGNORED - skip)
    one_sided = [key for key in keys if (baseline.get(key) is None) != (candidate.get(key) is None)]
    named = [
        f"{key} (unknown in {'baseline' if baseline.get(key) is None else 'candidate'})"
        for key in one_sided
        if key in _LOAD_KEYS_NAMED
    ]
    others = len(one_sided) - len(named)
    return named + ([f"{others} other load setting(s) recorded on one side only"] if others else [])


def _repeats(cell: CellOutcome) -> int:
    repeats = cell.summary.repeats if cell.summary is not None else None
    return repeats.count if repeats is not None else 1


def _figure(cell: CellOutcome, path: str) -> tuple[float | None, tuple[float, float] | None]:
    """A figure and its 95 % interval: the mean over repeats when there is one, else the run's value."""
    repeats = cell.summary.repeats if cell.summary is not None else None
    interval = (repeats.intervals or {}).get(path) if repeats is not None else None
    if interval is not None and interval.low is not None and interval.high is not None:
        return interval.mean, (interval.low, interval.high)
    return cell.metric(path), None


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
    pairs = [
        (f"{cell.deployment}/{cell.cell}", by_full[(cell.deployment, cell.cell)], cell)
        for cell in cand_ok
        if (cell.deployment, cell.cell) in by_full
    ]
    if not pairs:
        by_name: dict[str, CellOutcome] = {}
        for cell in base_ok:
            by_name.setdefault(cell.cell, cell)
        pairs = [(cell.cell, by_name[cell.cell], cell) for cell in cand_ok if cell.cell in by_name]
    paired = {id(cell) for _, base, cand in pairs for cell in (base, cand)}
    unmatched = sorted({f"{cell.deployment}/{cell.cell}" for cell in base_ok + cand_ok if id(cell) not in paired})
    return pairs, unmatched


def compare(
    baseline: SweepResults, candidate: SweepResults, threshold: float = DEFAULT_THRESHOLD, min_effect: float = DEFAULT_MIN_EFFECT
) -> Comparison:
    """Compare every matching cell; raise a clear error when nothing matches."""
    if threshold < 0:
        raise UserError("--threshold must be zero or positive, e.g. 0.1 for 10%")
    if min_effect < 0:
        raise UserError("--min-effect must be zero or positive, e.g. 0.05 for 5%")
    pairs, unmatched = match_cells(baseline, candidate)
    if not pairs:
        raise UserError(
            f"{baseline.source} and {candidate.source} have no finished cells in common; "
            "compare runs or sweeps that used the same cell names"
        )
    cells: list[CellComparison] = []
    for name, base, cand in pairs:
        changes, unknown = [], []
        for metric in COMPARED_METRICS:
            (before, before_interval), (after, after_interval) = _figure(base, metric.path), _figure(cand, metric.path)
            if before is not None and after is not None:
                changes.append(MetricChange(name, metric, before, after, before_interval, after_interval))
            elif (before is None) != (after is None):
                unknown.append(f"{metric.label} (unknown in {'baseline' if before is None else 'candidate'})")
        cells.append(
            CellComparison(
                name,
                level_label(cand),
                changes,
                (_failed_fraction(base), _failed_fraction(cand)),
                load_differences(base.load, cand.load),
                (_repeats(base), _repeats(cand)),
                unknown,
                load_unknown(base.load, cand.load),
            )
        )
    return Comparison(baseline, candidate, threshold, cells, unmatched, min_effect)


def _with_interval(value: float, interval: tuple[float, float] | None) -> str:
    """'33.10 ± 1.20' for a repeated figure, '33.10' for a single run's."""
    if interval is None:
        return fmt(value, 2)
    return f"{fmt(value, 2)} ± {fmt((interval[1] - interval[0]) / 2, 2)}"


def print_comparison(comparison: Comparison, console: Console) -> None:
    """A table per matched cell, the headline ratios, then the regressions."""
    console.print(f"[bold]baseline[/] {comparison.baseline.source}  vs  [bold]candidate[/] {comparison.candidate.source}")
    for cell in comparison.cells:
        table = RichTable(title=f"{cell.name} ({cell.level})", title_justify="left")
        for column in ("metric", "baseline", "candidate", "candidate vs baseline", "verdict"):
            table.add_column(column)
        for change in cell.changes:
            verdict = change.verdict(comparison.threshold, comparison.min_effect)
            shown = {"regressed": "[red]REGRESSION[/]", "improved": "[green]better[/]"}.get(verdict, verdict)
            table.add_row(
                change.metric.label,
                _with_interval(change.baseline, change.baseline_interval),
                _with_interval(change.candidate, change.candidate_interval),
                change.phrase(),
                shown,
            )
        console.print(table)
        console.print(f"  {cell.judged_by(comparison.threshold, comparison.min_effect)}")
        if cell.load_differences:
            console.print(
                f"[yellow]  ⚠ the loads differ ({'; '.join(cell.load_differences)}): these ratios compare different workloads[/]"
            )
        if cell.unknown or cell.load_unknown:
            console.print(f"  not compared, unknown on one side: {', '.join(cell.unknown + cell.load_unknown)}")
    for line in comparison.headlines():
        console.print(f"• {line}")
    if comparison.unmatched:
        console.print(f"[yellow]not compared (only on one side):[/] {', '.join(comparison.unmatched)}")
    regressions = comparison.regressions()
    if regressions:
        console.print(f"[red bold]{len(regressions)} regression(s) beyond {comparison.basis()}:[/]")
        for line in regressions:
            console.print(f"[red]  ✗ {line}[/]")
    else:
        console.print(f"[green]no regression beyond {comparison.basis()}[/]")
