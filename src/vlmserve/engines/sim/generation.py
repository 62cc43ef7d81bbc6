"""Decide up front what a simulated request will generate: tokens, text, why it stops.

The sim engine knows the whole answer when the request arrives; the scheduler only
decides *when* each token comes out. Knowing the length up front is what lets the
scheduler model run ahead of time in the planner, and it makes `stop` strings,
`min_tokens`, `ignore_eos` and `max_tokens` interact as in vLLM:
- the natural length (the EOS) is drawn from the engine's output-length distribution,
  never shorter than min_tokens; `ignore_eos` removes it;
- the answer is cut at max_tokens (finish_reason "length") or at EOS ("stop");
- a stop string ends the answer at the token that completes it (finish_reason "stop",
  the stop string itself is not returned), but not within the first min_tokens tokens.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.options import OutputLengthDistribution
from vlmserve.engines.sim.protocol import ParsedRequest

_PUNCTUATION_SHARE = 0.06
_WORD_COUNT = len(tokenizer.OUTPUT_WORDS)
_CUM_WEIGHTS = list(
    itertools.accumulate(
        [(1.0 - _PUNCTUATION_SHARE) / _WORD_COUNT] * _WORD_COUNT
        + [_PUNCTUATION_SHARE / len(tokenizer.OUTPUT_PUNCTUATION)] * len(tokenizer.OUTPUT_PUNCTUATION)
    )
)
_PIECE_INDEXES = range(len(tokenizer.OUTPUT_PIECES))


@dataclass
class OutputPlan:
    """The answer a request will get."""

    token_ids: list[int]
    pieces: list[str]
    """Text of each generated token ('' for tokens held back by a stop string)."""
    finish_reason: str
    stop_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def plan_output(request: ParsedRequest, distribution: OutputLengthDistribution, rng: random.Random) -> OutputPlan:
    """Draw the answer for `request` (deterministic for a given rng state)."""
    max_tokens = request.max_tokens
    if request.ignore_eos:
        count, finish_reason = max_tokens, "length"
    else:
        natural = max(distribution.sample(rng), request.min_tokens, 1)
        count, finish_reason = (max_tokens, "length") if natural >= max_tokens else (natural, "stop")
    indexes = rng.choices(_PIECE_INDEXES, cum_weights=_CUM_WEIGHTS, k=count)
    pieces = [tokenizer.OUTPUT_PIECES[index] for index in indexes]
    token_ids = [tokenizer.OUTPUT_PIECE_IDS[index] for index in indexes]
    plan = OutputPlan(token_ids=token_ids, pieces=pieces, finish_reason=finish_reason)
    if request.stop:
        _apply_stop_strings(plan, request.stop, request.min_tokens)
    return plan


def _apply_stop_strings(plan: OutputPlan, stops: list[str], min_tokens: int) -> None:
    """Cut the plan at the earliest stop string that completes after min_tokens tokens."""
    ends = list(itertools.accumulate(len(piece) for piece in plan.pieces))
    text = "".join(plan.pieces)
    earliest_start = ends[min_tokens - 1] if min_tokens > 0 and ends else 0
    best: tuple[int, int, str] | None = None  # (token index completing it, start, stop)
    for stop in stops:
        start = text.find(stop, earliest_start)
        if start < 0:
            continue
        end = start + len(stop)
        token_index = next(index for index, token_end in enumerate(ends) if token_end >= end)
        if best is None or (token_index, start) < (best[0], best[1]):
            best = (token_index, start, stop)
    if best is None:
        return
    token_index, start, stop = best
    kept = plan.pieces[: token_index + 1]
    trimmed: list[str] = []
    position = 0
    for piece in kept:
        room = max(0, start - position)
        trimmed.append(piece[:room])
        position += len(piece)
    plan.pieces = trimmed
    plan.token_ids = plan.token_ids[: token_index + 1]
    plan.finish_reason = "stop"
    plan.stop_reason = stop
