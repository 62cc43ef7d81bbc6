"""SLO search: the highest request rate (open loop) or concurrency (closed loop) at which the SLOs hold.

Why: "how many requests per second can this deployment hold under p95 TTFT 500 ms" is the
question people ask of a deployment; reading it off a sweep by hand is slow and coarse
(`vllm bench sweep serve_sla`, AIPerf's adaptive search and guidellm's sweep answer it in one
command). This is a *profile* in the bench's profile/strategy/constraint split: it decides
which runs happen; each run is an ordinary bench run, stored in the history with its run id.

Rules kept:
- a probe point is one load level run `repeat` times (fresh prompts each, see bench.repeats),
  stored as one run; a repeat *meets* the SLOs when every objective holds on its own records,
  at most 1 % of its requests failed and it was not stopped as oversaturated; the point
  *holds* when more than half of its repeats meet (so one noisy repeat neither passes nor
  fails a point); repeats stop once the majority is decided;
- the search probes the low end first (missing there ends it: the SLOs cannot be met in the
  range), then the high end (holding there ends it: raise the range), then bisects between
  the highest level that held and the lowest that missed: geometric midpoints for rates,
  integer midpoints for concurrency, until high/low ≤ 1 + precision (or the concurrencies are
  adjacent) or `max_probes` points have run;
- it assumes that latency grows with load (more load never makes an SLO easier); a point that
  breaks this is reported as it ran, never hidden;
- each probe point gets its own seed (`seed + 1 + probe index`), so no probe is served from
  the prefix cache an earlier probe filled;
- open loops stop early when oversaturated unless the load says otherwise (bench.saturation):
  a point far above the boundary costs seconds, not minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal

from rich.console import Console

from vlmserve.errors import UserError
from vlmserve.results.run import RunResult
from vlmserve.spec import SLO, LoadSpec

DEFAULT_REPEAT = 3
"""Repeats per probe point when the user does not say (a majority of 3 survives one noisy run)."""

DEFAULT_PRECISION = 0.1
"""Stop bisecting when the highest held and lowest missed levels are within 10 % of each other."""

DEFAULT_MAX_PROBES = 12

Knob = Literal["rate", "concurrency"]


@dataclass(frozen=True)
class SearchSpace:
    """Which load level is searched, its range, and when the bisection is fine enough."""

    knob: Knob
    low: float
    high: float
    precision: float = DEFAULT_PRECISION
    max_probes: int = DEFAULT_MAX_PROBES

    def __post_init__(self) -> None:
        flag = f"--{self.knob}-range"
        if not 0 < self.low < self.high:
            raise UserError(f"{flag} {self.low:g}:{self.high:g}: give LOW:HIGH with 0 < LOW < HIGH, e.g. 1:64")
        if self.knob == "concurrency" and (self.low != int(self.low) or self.high != int(self.high)):
            raise UserError(f"{flag} {self.low:g}:{self.high:g}: concurrencies are whole users, e.g. 1:256")
        if self.precision <= 0:
            raise UserError(f"--precision {self.precision:g}: give a positive fraction, e.g. 0.1 for 10%")
        if self.max_probes < 2:
            raise UserError(f"--max-probes {self.max_probes}: the search needs at least 2 (both ends of the range)")

    def fine_enough(self, held: float, missed: float) -> bool:
        if self.knob == "concurrency" and missed - held <= 1:
            return True
        return missed / held <= 1.0 + self.precision

    def midpoint(self, held: float, missed: float) -> float:
        middle = math.sqrt(held * missed)
        if self.knob == "concurrency":
            return float(min(max(round(middle), int(held) + 1), int(missed) - 1))
        return round(middle, 4)


def parse_range(text: str, flag: str) -> tuple[float, float]:
    """'1:64' → (1.0, 64.0); anything else is one line saying how to write it."""
    low_text, sep, high_text = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(low_text), float(high_text)
    except ValueError:
        raise UserError(f"{flag} '{text}': write it as LOW:HIGH, e.g. 1:64") from None


@dataclass
class ProbePoint:
    """One load level as it ran: its stored run, how many repeats met the SLOs, the verdict."""

    level: float
    result: RunResult
    met: int
    ran: int

    @property
    def held(self) -> bool:
        return self.met * 2 > self.ran

    @property
    def run_id(self) -> str | None:
        return self.result.run_id

    def row(self) -> dict[str, object]:
        summary = self.result.summary
        checks = summary.goodput.checks if summary.goodput is not None else {}
        return {
            "level": self.level,
            "held": self.held,
            "repeats_met": self.met,
            "repeats_run": self.ran,
            "run_id": self.run_id,
            "stopped": summary.meta.stopped,
            "requests_per_s": summary.throughput.requests_per_s,
            "slo_measured_ms": {key: check.measured_ms for key, check in checks.items()},
            "repeats": [
                {
                    "repeat": row.repeat,
                    "seed": row.seed,
                    "slo_met": row.slo_met,
                    "stopped": row.stopped,
                    "slo_checks": row.slo_checks,
                }
                for row in (summary.repeats.runs if summary.repeats is not None else [])
            ],
        }


@dataclass
class SearchOutcome:
    """Every probe in the order it ran and the boundary they found."""

    space: SearchSpace
    slo: SLO
    probes: list[ProbePoint] = field(default_factory=list)

    @property
    def held(self) -> ProbePoint | None:
        """The highest level that held."""
        return max((probe for probe in self.probes if probe.held), key=lambda probe: probe.level, default=None)

    @property
    def missed(self) -> ProbePoint | None:
        """The lowest level that missed."""
        return min((probe for probe in self.probes if not probe.held), key=lambda probe: probe.level, default=None)

    @property
    def status(self) -> str:
        """'bounded' (a held and a missed level), 'below-range' (missed at the low end), 'above-range'."""
        if self.held is None:
            return "below-range"
        if self.missed is None:
            return "above-range"
        return "bounded"

    def sentence(self) -> str:
        """The answer in one line, with the interval and the runs behind it."""
        unit = "req/s" if self.space.knob == "rate" else "users"
        slo_text = ",".join(f"{key}={value * 1000:g}ms" for key, value in self.slo.bounds_s.items())
        held, missed = self.held, self.missed
        if held is None:
            assert missed is not None
            return (
                f"the SLOs ({slo_text}) are missed even at {self.space.knob} {missed.level:g} {unit} "
                f"(run {missed.run_id}); lower the range's low end"
            )
        if missed is None:
            return (
                f"the SLOs ({slo_text}) hold up to {self.space.knob} {held.level:g} {unit}, the top of the range "
                f"(run {held.run_id}); raise the range's high end"
            )
        return (
            f"highest {self.space.knob} meeting {slo_text}: {held.level:g} {unit} "
            f"(held at {held.level:g}, run {held.run_id}; missed at {missed.level:g}, run {missed.run_id})"
        )

    def to_json(self) -> dict[str, object]:
        held, missed = self.held, self.missed
        return {
            "knob": self.space.knob,
            "range": [self.space.low, self.space.high],
            "precision": self.space.precision,
            "slo": {key: value * 1000 for key, value in self.slo.bounds_s.items()},
            "status": self.status,
            "boundary": {
                "held": held.level if held else None,
                "held_run_id": held.run_id if held else None,
                "missed": missed.level if missed else None,
                "missed_run_id": missed.run_id if missed else None,
            },
            "answer": self.sentence(),
            "probes": [probe.row() for probe in self.probes],
        }


RunPoint = Callable[[LoadSpec, Callable[[list[RunResult]], bool]], Awaitable[RunResult]]
"""Runs one probe load (all its repeats, stopping once `settled`) and returns it stored."""


def repeat_met(result: RunResult) -> bool:
    from vlmserve.bench.repeats import MAX_FAILED_FRACTION, repeat_verdict

    return bool(repeat_verdict(result.summary, MAX_FAILED_FRACTION))


def majority_settled(repeats: int) -> Callable[[list[RunResult]], bool]:
    """True once more than half of `repeats` met, or more than half missed."""

    def settled(results: list[RunResult]) -> bool:
        met = sum(1 for result in results if repeat_met(result))
        return met * 2 > repeats or (len(results) - met) * 2 >= repeats

    return settled


def probe_load(template: LoadSpec, space: SearchSpace, level: float, index: int) -> LoadSpec:
    """The load of probe `index` at `level`: the template's shape, its own seed, the over-saturation stop."""
    update: dict[str, object] = {
        space.knob: int(level) if space.knob == "concurrency" else level,
        "seed": template.seed + 1 + index,
        "name": f"{space.knob}={level:g}",
    }
    if template.stop_when_oversaturated is None:
        update["stop_when_oversaturated"] = True
    return template.model_copy(update=update)


def require_objectives(slo: SLO) -> None:
    """The search has nothing to find without objectives: one line saying how to give them."""
    if not slo.bounds_s:
        raise UserError("give --slo, e.g. --slo ttft_p95=500ms,tpot_p95=50ms: the search needs objectives")


async def search(
    template: LoadSpec, slo: SLO, space: SearchSpace, run_point: RunPoint, console: Console | None = None
) -> SearchOutcome:
    """Probe the ends of the range, then bisect; returns every probe and the boundary."""
    require_objectives(slo)
    console = console or Console(stderr=True)
    outcome = SearchOutcome(space, slo)

    async def probe(level: float) -> ProbePoint:
        load = probe_load(template, space, level, len(outcome.probes))
        console.print(f"probe {len(outcome.probes) + 1}: {space.knob} {level:g} ({load.repeat} repeat(s))")
        result = await run_point(load, majority_settled(load.repeat))
        runs = result.summary.repeats.runs if result.summary.repeats is not None else []
        met = sum(1 for row in runs if row.slo_met)
        point = ProbePoint(level, result, met, max(len(runs), 1))
        outcome.probes.append(point)
        console.print(f"  {'held' if point.held else 'missed'}: {met} of {point.ran} repeat(s) met the SLOs (run {point.run_id})")
        return point

    if not (await probe(space.low)).held:
        return outcome
    if (await probe(space.high)).held:
        return outcome
    while len(outcome.probes) < space.max_probes:
        held, missed = outcome.held, outcome.missed
        assert held is not None and missed is not None
        if held.level >= missed.level:  # latency did not grow with load: say so, stop here
            console.print(
                f"[yellow]{space.knob} {held.level:g} held but {missed.level:g} missed below it: "
                "the server is not monotone in this range; the boundary is uncertain[/]"
            )
            break
        if space.fine_enough(held.level, missed.level):
            break
        await probe(space.midpoint(held.level, missed.level))
    return outcome
