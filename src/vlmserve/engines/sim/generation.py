"""Decide up front what a simulated request will generate: how many tokens, which, and why it stops.

The sim engine knows the answer's length when the request arrives; the scheduler only
decides *when* each token comes out. Knowing the length up front lets the scheduler
model run ahead of time in the planner, and makes `stop`, `min_tokens`, `ignore_eos`
and `max_tokens` interact as in vLLM:
- the natural length (the EOS) is drawn from the engine's output-length distribution,
  never shorter than min_tokens; `ignore_eos` removes it;
- the answer is cut at max_tokens (finish_reason "length") or at EOS ("stop");
- a stop string ends the answer at the token that completes it (finish_reason "stop",
  the stop string itself is not returned), but not within the first min_tokens tokens.

The tokens themselves are produced lazily, O(1) each: token i of a request is entry
`(offset + i × stride) mod 2^16` of one shared table of random piece indexes, with a
per-request offset and odd stride. An 8,000-token answer costs nothing until streamed.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

from vlmserve.engines.sim import tokenizer
from vlmserve.engines.sim.options import OutputLengthDistribution
from vlmserve.engines.sim.protocol import ParsedRequest

_PUNCTUATION_SHARE = 0.06
_TABLE_BITS = 16
_TABLE_MASK = (1 << _TABLE_BITS) - 1


def _build_piece_table() -> list[int]:
    words = len(tokenizer.OUTPUT_WORDS)
    marks = len(tokenizer.OUTPUT_PUNCTUATION)
    weights = [(1.0 - _PUNCTUATION_SHARE) / words] * words + [_PUNCTUATION_SHARE / marks] * marks
    rng = random.Random(0x51A)
    return rng.choices(range(words + marks), cum_weights=list(itertools.accumulate(weights)), k=1 << _TABLE_BITS)


_PIECE_TABLE = _build_piece_table()
_PIECES = tokenizer.OUTPUT_PIECES
_PIECE_IDS = tokenizer.OUTPUT_PIECE_IDS


class PlannedTokenIds(Sequence[int]):
    """The ids of a plan's tokens, computed on access (what the scheduler hashes output blocks with)."""

    def __init__(self, plan: "OutputPlan") -> None:
        self._plan = plan

    def __len__(self) -> int:
        return self._plan.num_tokens

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self._plan.token_id(position) for position in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._plan.token_id(index)


@dataclass
class OutputPlan:
    """The answer a request will get (tokens generated on demand)."""

    num_tokens: int
    finish_reason: str
    offset: int = 0
    stride: int = 1
    stop_reason: str | None = None
    trimmed: dict[int, str] = field(default_factory=dict)
    """Text overrides near a stop string: token index → the part of its text that is returned."""

    def piece_index(self, index: int) -> int:
        """Which of tokenizer.OUTPUT_PIECES token `index` is."""
        return _PIECE_TABLE[(self.offset + index * self.stride) & _TABLE_MASK]

    def piece(self, index: int) -> str:
        """Text of token `index` ('' when a stop string withholds it)."""
        if self.trimmed and index in self.trimmed:
            return self.trimmed[index]
        return _PIECES[self.piece_index(index)]

    def token_id(self, index: int) -> int:
        return _PIECE_IDS[self.piece_index(index)]

    @property
    def token_ids(self) -> PlannedTokenIds:
        return PlannedTokenIds(self)

    @property
    def text(self) -> str:
        return "".join(self.piece(index) for index in range(self.num_tokens))


def plan_output(request: ParsedRequest, distribution: OutputLengthDistribution, rng: random.Random) -> OutputPlan:
    """Draw the answer for `request` (deterministic for a given rng state)."""
    max_tokens = request.max_tokens
    if request.ignore_eos:
        count, finish_reason = max_tokens, "length"
    else:
        natural = max(distribution.sample(rng), request.min_tokens, 1)
        count, finish_reason = (max_tokens, "length") if natural >= max_tokens else (natural, "stop")
    plan = OutputPlan(
        num_tokens=count,
        finish_reason=finish_reason,
        offset=rng.getrandbits(_TABLE_BITS),
        stride=rng.getrandbits(_TABLE_BITS) | 1,
    )
    if request.stop:
        _apply_stop_strings(plan, request.stop, request.min_tokens)
    return plan


def _apply_stop_strings(plan: OutputPlan, stops: list[str], min_tokens: int) -> None:
    """Cut the plan at the first token that completes a stop string after min_tokens tokens."""
    longest = max(len(stop) for stop in stops)
    text = ""
    starts: list[int] = []  # text offset where each token begins
    search_from = 0
    for index in range(plan.num_tokens):
        starts.append(len(text))
        text += plan.piece(index)
        if index + 1 < min_tokens:
            search_from = len(text)
            continue
        window_start = max(search_from, len(text) - len(plan.piece(index)) - longest + 1)
        found = [(text.find(stop, window_start), stop) for stop in stops]
        hits = [(start, stop) for start, stop in found if start >= 0]
        if not hits:
            continue
        start, stop = min(hits)
        # Tokens from the one where the stop string begins keep only the text before it.
        for position in range(index, -1, -1):
            if starts[position] + len(plan.piece(position)) <= start:
                break
            plan.trimmed[position] = plan.piece(position)[: max(0, start - starts[position])]
        plan.num_tokens = index + 1
        plan.finish_reason = "stop"
        plan.stop_reason = stop
        return
