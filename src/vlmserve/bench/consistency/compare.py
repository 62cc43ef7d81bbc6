"""Compare each checked request's answer alone with its answer under load (pure functions).

Rules this module keeps:
- An answer is compared as token ids when the server returned them (vLLM's `return_token_ids`),
  else as token strings from `logprobs`, else as characters of the text; the unit is named in
  every position reported ("token 12", "char 40"), and the character position is always given.
- The first differing position is the first index where the two sequences differ, or the
  shorter length when one is a prefix of the other.
- An image swap is a finding of its own: an image case whose loaded answer differs from its
  alone answer and equals another image's alone answer, or equals another image's loaded answer
  although the two alone answers differ. Both mean the server confused one image with another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

UNITS = ("token_id", "token", "char")
EXCERPT_CHARS = 60


@dataclass(frozen=True)
class Answer:
    """One response's generated output, as the server returned it."""

    text: str
    tokens: tuple[int | str, ...] | None = None
    unit: str = "char"
    """What `sequence` counts: token_id, token or char (see UNITS)."""
    logprobs: tuple[float, ...] | None = None

    @property
    def sequence(self) -> Sequence[int | str]:
        return self.tokens if self.tokens is not None else tuple(self.text)


def answer_from_response(data: Any) -> Answer:
    """The first choice of a chat completion response; ValueError if it has none."""
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the response has no choices[0].message") from None
    token_ids = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    logprobs = None
    if isinstance(content, list) and all(isinstance(entry, dict) for entry in content):
        logprobs = tuple(float(entry.get("logprob", 0.0)) for entry in content)
    if isinstance(token_ids, list) and all(isinstance(token, int) for token in token_ids):
        return Answer(text, tuple(token_ids), "token_id", logprobs)
    if isinstance(content, list) and logprobs is not None:
        return Answer(text, tuple(str(entry.get("token", "")) for entry in content), "token", logprobs)
    return Answer(text)


def first_difference(left: Sequence[object], right: Sequence[object]) -> int | None:
    """Index of the first differing item (the shorter length if one is a prefix); None if equal."""
    for index, (a, b) in enumerate(zip(left, right)):
        if a != b:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


@dataclass
class CaseResult:
    """One checked request: its answers alone and under load, and how they differ."""

    case_id: str
    kind: str
    alone: Answer | None = None
    loaded: Answer | None = None
    error: str | None = None
    """Why an answer is missing (the HTTP status and message), else None."""
    in_flight_at_send: int = 0
    """Other requests in flight when the loaded copy was sent (proof it ran under load)."""

    @property
    def compared(self) -> bool:
        return self.alone is not None and self.loaded is not None

    @property
    def unit(self) -> str | None:
        if self.alone is None or self.loaded is None:
            return None
        return self.alone.unit if self.alone.unit == self.loaded.unit else "char"

    def _sequences(self) -> tuple[Sequence[object], Sequence[object]]:
        assert self.alone is not None and self.loaded is not None
        if self.unit == "char":
            return tuple(self.alone.text), tuple(self.loaded.text)
        return self.alone.sequence, self.loaded.sequence

    @property
    def first_difference(self) -> int | None:
        return first_difference(*self._sequences()) if self.compared else None

    @property
    def first_difference_char(self) -> int | None:
        if self.alone is None or self.loaded is None:
            return None
        return first_difference(self.alone.text, self.loaded.text)

    @property
    def identical(self) -> bool:
        return self.compared and self.first_difference is None

    @property
    def max_logprob_delta(self) -> float | None:
        """Largest |logprob alone − logprob loaded| over the tokens of identical answers."""
        if not self.identical or self.alone is None or self.loaded is None:
            return None
        if self.alone.logprobs is None or self.loaded.logprobs is None:
            return None
        return max((abs(a - b) for a, b in zip(self.alone.logprobs, self.loaded.logprobs)), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "case_id": self.case_id,
            "kind": self.kind,
            "identical": self.identical,
            "unit": self.unit,
            "first_difference": self.first_difference,
            "first_difference_char": self.first_difference_char,
            "in_flight_at_send": self.in_flight_at_send,
            "error": self.error,
            "alone_tokens": len(self.alone.sequence) if self.alone else None,
            "loaded_tokens": len(self.loaded.sequence) if self.loaded else None,
            "max_logprob_delta": self.max_logprob_delta,
        }
        position = self.first_difference_char
        if self.alone is not None and self.loaded is not None and position is not None:
            start = max(0, position - 10)
            entry["alone_excerpt"] = self.alone.text[start : start + EXCERPT_CHARS]
            entry["loaded_excerpt"] = self.loaded.text[start : start + EXCERPT_CHARS]
        return entry


@dataclass(frozen=True)
class ImageSwap:
    """Two image cases the server confused under load."""

    case_id: str
    other_case_id: str
    how: str


def find_image_swaps(results: list[CaseResult], questions: dict[str, str]) -> list[ImageSwap]:
    """Image cases (same question, different image) whose loaded answers show a confusion."""
    images = [result for result in results if result.kind == "image" and result.compared]
    swaps: list[ImageSwap] = []
    seen: set[frozenset[str]] = set()
    for case in images:
        if case.identical:
            continue
        assert case.alone is not None and case.loaded is not None
        for other in images:
            if other is case or questions.get(other.case_id) != questions.get(case.case_id):
                continue
            assert other.alone is not None and other.loaded is not None
            if other.alone.sequence == case.alone.sequence:
                continue  # the server cannot tell these two images apart even alone
            pair = frozenset((case.case_id, other.case_id))
            if case.loaded.sequence == other.alone.sequence:
                how = f"under load {case.case_id} got the answer {other.case_id}'s image gets alone"
            elif case.loaded.sequence == other.loaded.sequence:
                how = f"under load {case.case_id} and {other.case_id} got the same answer; alone they differ"
            else:
                continue
            if pair not in seen:
                seen.add(pair)
                swaps.append(ImageSwap(case.case_id, other.case_id, how))
    return swaps


def same_as_other(case: CaseResult, results: list[CaseResult]) -> str | None:
    """The checked case whose alone answer this case got under load, if any (an answer swap)."""
    if case.identical or case.loaded is None:
        return None
    for other in results:
        if other is not case and other.alone is not None and other.alone.sequence == case.loaded.sequence:
            return other.case_id
    return None


@dataclass
class ConsistencyReport:
    """Everything the check found; `passed` decides the exit code."""

    base_url: str
    model: str
    concurrency: int
    min_identical: float
    fillers_sent: int
    simulated: bool
    results: list[CaseResult]
    image_swaps: list[ImageSwap]
    notes: list[str] = field(default_factory=list)
    variant: str | None = None
    """The deployment variant checked, when the check started the deployment (prefix caching on/off)."""

    @property
    def compared(self) -> list[CaseResult]:
        return [result for result in self.results if result.compared]

    @property
    def identical_fraction(self) -> float:
        compared = self.compared
        return sum(result.identical for result in compared) / len(compared) if compared else 0.0

    @property
    def failed(self) -> list[CaseResult]:
        return [result for result in self.results if not result.compared]

    @property
    def units(self) -> list[str]:
        return sorted({result.unit for result in self.compared if result.unit})

    def distinct_alone_image_answers(self) -> tuple[int, int]:
        """(distinct alone answers, image cases answered alone)."""
        answers = [tuple(r.alone.sequence) for r in self.results if r.kind == "image" and r.alone is not None]
        return len(set(answers)), len(answers)

    @property
    def problems(self) -> list[str]:
        """Why the check fails (empty: it passes)."""
        problems: list[str] = []
        if self.identical_fraction < self.min_identical:
            problems.append(f"identical fraction {self.identical_fraction:.3f} is below --min-identical {self.min_identical:g}")
        if self.image_swaps:
            problems.append(f"{len(self.image_swaps)} image swap(s): the server confused one image with another under load")
        if self.failed:
            problems.append(f"{len(self.failed)} checked request(s) got no answer")
        return problems

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        deltas = [d for d in (result.max_logprob_delta for result in self.results) if d is not None]
        in_flight = [result.in_flight_at_send for result in self.compared]
        distinct, answered = self.distinct_alone_image_answers()
        return {
            "kind": "consistency",
            "variant": self.variant,
            "simulated": self.simulated,
            "base_url": self.base_url,
            "model": self.model,
            "concurrency": self.concurrency,
            "fillers_sent": self.fillers_sent,
            "min_identical": self.min_identical,
            "passed": self.passed,
            "problems": self.problems,
            "checked": len(self.results),
            "compared": len(self.compared),
            "identical": sum(result.identical for result in self.compared),
            "identical_fraction": self.identical_fraction,
            "units": self.units,
            "by_kind": {
                kind: {"compared": len(of_kind), "identical": sum(result.identical for result in of_kind)}
                for kind in ("text", "image")
                if (of_kind := [result for result in self.compared if result.kind == kind])
            },
            "in_flight_at_send": {
                "min": min(in_flight, default=0),
                "max": max(in_flight, default=0),
                "mean": sum(in_flight) / len(in_flight) if in_flight else 0.0,
            },
            "max_logprob_delta_identical": max(deltas) if deltas else None,
            "image_cases": answered,
            "image_distinct_alone_answers": distinct,
            "image_swaps": [vars(swap) for swap in self.image_swaps],
            "differing": [
                {**result.to_dict(), "same_as": same_as_other(result, self.results)}
                for result in self.compared
                if not result.identical
            ],
            "cases": [result.to_dict() for result in self.results],
            "notes": self.notes,
        }
