"""Choose the configuration to recommend from the measured candidates, and say why in one sentence.

Rule: the candidate with the highest goodput wins, but a change from the baseline is recommended
only when measurement proves it better: the baseline *missed* the SLOs at a rate where the winner
*held* them (its interval's upper end is at or below the winner's lower end). Otherwise the two
cannot be told apart with the measurements made, and the baseline is recommended, said plainly.
Intervals are the SLO search's bisection bounds (held at low, missed at high), each point judged
by a majority of its repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.tune.store import CandidateRecord


@dataclass(frozen=True)
class Recommendation:
    """The chosen candidate, the best measured one, and the sentence that explains the choice."""

    chosen: CandidateRecord | None
    best: CandidateRecord | None
    baseline: CandidateRecord | None
    sentence: str
    within_interval: list[str]
    """Ids of candidates whose interval overlaps the best's (not distinguishable from it)."""


def _interval_text(record: CandidateRecord) -> str:
    high = record.interval.high if record.interval else None
    low = record.interval.low if record.interval else 0.0
    return f"{low:g}–{high:g} req/s" if high is not None else f"≥ {low:g} req/s (top of the range)"


def beats(winner: CandidateRecord, other: CandidateRecord) -> bool:
    """Did `other` miss the SLOs at a rate where `winner` held them?"""
    if winner.interval is None or other.interval is None or other.interval.high is None:
        return False
    return other.interval.high <= winner.interval.low and winner.interval.low > 0


def recommend(records: list[CandidateRecord]) -> Recommendation:
    measured = [record for record in records if record.status == "measured" and record.goodput_rps is not None]
    baseline = next((record for record in records if record.baseline), None)
    if not measured:
        return Recommendation(None, None, baseline, "no candidate was measured; nothing to recommend", [])
    best = max(measured, key=lambda record: (record.goodput_rps or 0.0, record.baseline, -record.order))
    within = [record.id for record in measured if record.id != best.id and not beats(best, record)]
    if best.goodput_rps == 0.0:
        return Recommendation(
            None,
            best,
            baseline,
            "no candidate met the SLOs even at the low end of the rate range; lower the range or loosen the SLOs",
            within,
        )
    if baseline is None or baseline.status != "measured" or baseline.id == best.id:
        why = (
            "the baseline is the best measured candidate"
            if baseline is not None and baseline.id == best.id
            else "the baseline could not be measured"
        )
        return Recommendation(best, best, baseline, f"{why}: {best.label}, goodput {_interval_text(best)}", within)
    if beats(best, baseline):
        return Recommendation(
            best,
            best,
            baseline,
            f"{best.label} beats the baseline: goodput {_interval_text(best)} against "
            f"{_interval_text(baseline)} (the baseline missed the SLOs at a rate where it held them)",
            within,
        )
    return Recommendation(
        baseline,
        best,
        baseline,
        f"the baseline cannot be told apart from the best candidate ({best.label}: "
        f"{_interval_text(best)}; baseline {_interval_text(baseline)}); keeping the baseline",
        within,
    )
