"""The contract between the scheduler model and whatever prices a step.

The scheduler decides *what* runs in a step (which requests prefill how many tokens,
which decode); a StepCostModel decides *how long* that step takes. The sim engine
uses a parametric model with named profiles; the planner uses a roofline model of a
real model on a real GPU. Both implement this protocol, so the scheduler is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StepContents:
    """What one engine step computes."""

    prefill_tokens: int
    """New prompt tokens computed this step (after prefix-cache hits), over all requests."""
    prefill_seqs: int
    """Requests that computed prompt tokens this step."""
    decode_seqs: int
    """Requests that generated one token this step."""
    kv_tokens_read: int
    """Context tokens whose KV was read by attention this step, over all requests."""
    image_tokens: int = 0
    """Vision tokens encoded this step (vision-encoder work)."""
    images: int = 0
    """Images encoded this step."""

    @property
    def batch_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs


class StepCostModel(Protocol):
    """Prices a step in seconds of engine time."""

    def step_time_s(self, step: StepContents) -> float:
        """Seconds this step takes on the modelled hardware."""
        ...
