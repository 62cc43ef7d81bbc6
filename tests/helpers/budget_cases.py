"""One table of token-budget cases, run against both implementations of the rule: the
in-process bucket (tests/unit/gateway/test_budget_rule.py) and the Redis script
(tests/integration/gateway/test_redis_buckets.py). The rule (gateway/admission.py):

- a request waits for min(cost, capacity) and is then charged its whole cost (a cost over the
  whole budget is admitted only with a full bucket, and leaves it in debt);
- the settle gives back the charge less the use: never more than was charged, a debt when the
  use was larger, and never past a full bucket.

The refill is too slow to notice here (RATE_PER_S), so each level is exact to LEVEL_TOLERANCE.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_PER_S = 1e-6
LEVEL_TOLERANCE = 0.01


@dataclass(frozen=True)
class Admit:
    cost: int
    admitted: bool
    level: float  # the bucket's tokens after this step


@dataclass(frozen=True)
class Settle:
    charged: int
    used: int
    level: float


Step = Admit | Settle


@dataclass(frozen=True)
class BudgetCase:
    name: str
    capacity: float
    steps: tuple[Step, ...]


def _walk_past_attempt() -> tuple[Step, ...]:
    """Twelve requests asking for max_tokens 8000 (cost 8016) and using 216, one after the other,
    against a budget of 1000: the first is admitted with a full bucket, the others wait."""
    steps: list[Step] = [Admit(8016, True, 1000 - 8016), Settle(8016, 216, 1000 - 216)]
    for _ in range(11):
        steps.append(Admit(8016, False, 1000 - 216))
    return tuple(steps)


BUDGET_CASES = (
    BudgetCase(
        "a cost within the budget is charged whole and settled to its use",
        1000,
        (Admit(300, True, 700), Admit(800, False, 700), Settle(300, 100, 900), Admit(800, True, 100)),
    ),
    BudgetCase(
        "a cost over the whole budget waits for a full bucket and is charged whole",
        1000,
        (Admit(2135, True, -1135), Admit(1, False, -1135), Settle(2135, 2135, -1135)),
    ),
    BudgetCase(
        "the refund is never more than the charge: use beyond it is a debt",
        1000,
        (Admit(500, True, 500), Settle(500, 2500, -1500), Admit(10, False, -1500)),
    ),
    BudgetCase(
        "a refund never fills the bucket past its capacity",
        1000,
        (Admit(100, True, 900), Settle(100, 0, 1000), Settle(0, 0, 1000)),
    ),
    BudgetCase("max_tokens far over the budget cannot be walked past by refunds", 1000, _walk_past_attempt()),
)
