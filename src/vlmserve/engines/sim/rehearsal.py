"""A cost model whose best configuration is known by construction, for rehearsing `vlmserve tune`.

Why: a tuner is only proven where the right answer is known. With `--rehearsal-optimum
max_num_seqs=32,max_num_batched_tokens=2048`, every step of this engine takes the profile's time
multiplied by `penalty ** distance`, where distance is the number of doublings (or halvings)
between each named setting and its optimum, summed over the settings. At the optimum the factor
is 1; one doubling away it is `penalty` (2 by default: every step twice as slow, so about half the
goodput under any latency SLO), capped at `MAX_FACTOR`. The engine's own scheduling rules still apply on top, so a far
setting can only lose more (a small max_num_seqs also queues); the optimum is the only point
with factor 1. The planner side of `tune` reads the same factor (`RehearsalCost`) so its
simulated ranking sees what the engine does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vlmserve.errors import UserError
from vlmserve.sched.step_cost import StepContents, StepCostModel

REHEARSAL_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "api_server_count")
"""The sim engine settings an optimum may name (vLLM flag names; the sim receives each from a spec)."""

DEFAULT_PENALTY = 2.0
"""Step-time factor per doubling away from the optimum."""

MAX_FACTOR = 8.0
"""Far points are capped at this factor, so a rehearsal's worst candidate (often the vLLM default, far
from a small optimum) is still measured in seconds. The construction holds: the optimum alone has
factor 1, every other point at least `penalty`."""


@dataclass(frozen=True)
class RehearsalOptimum:
    """Where the constructed optimum lies, and how steeply the step time grows away from it."""

    optimum: dict[str, float] = field(default_factory=dict)
    penalty: float = DEFAULT_PENALTY

    @classmethod
    def parse(cls, text: str, penalty: float = DEFAULT_PENALTY) -> "RehearsalOptimum":
        """'max_num_seqs=32,api_server_count=2' (dashes or underscores), or one line saying what is wrong."""
        optimum: dict[str, float] = {}
        for part in (item.strip() for item in text.split(",")):
            if not part:
                continue
            name, sep, raw = part.partition("=")
            key = name.strip().replace("-", "_")
            if not sep or key not in REHEARSAL_SETTINGS:
                raise UserError(
                    f"--rehearsal-optimum '{part}': write NAME=VALUE with NAME one of {', '.join(REHEARSAL_SETTINGS)}"
                )
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"--rehearsal-optimum '{part}': the value must be a positive number")
            optimum[key] = value
        if not optimum:
            raise UserError("--rehearsal-optimum: name at least one setting, e.g. max_num_seqs=32")
        if not (math.isfinite(penalty) and penalty >= 1.0):
            raise UserError(f"--rehearsal-penalty {penalty}: give a factor of 1 or more")
        return cls(optimum, penalty)

    def factor(self, settings: dict[str, float]) -> float:
        """The step-time multiplier of an engine running with `settings` (1 at the optimum)."""
        distance = sum(abs(math.log2(settings[name] / best)) for name, best in self.optimum.items())
        return float(min(self.penalty**distance, max(MAX_FACTOR, self.penalty)))

    def as_flag(self) -> str:
        """The `--rehearsal-optimum` text of this optimum."""
        return ",".join(f"{name}={value:g}" for name, value in self.optimum.items())


@dataclass(frozen=True)
class RehearsalCost:
    """A step-cost model scaled by a constant factor (the rehearsal's distance from its optimum)."""

    inner: StepCostModel
    factor: float

    def step_time_s(self, step: StepContents) -> float:
        return self.inner.step_time_s(step) * self.factor
