"""The planner's roofline as the sim engine's clock: `vlmserve engine sim --model M --gpu G --tp N`.

The sim engine asks for two things: a StepCostModel to time its steps and the number of
KV blocks its cache holds. Both come from the same PlanSetup the planner simulates, so
a gateway or an alert rule can be tried against "Gemma 4 31B on two H100s" on a laptop.
"""

from __future__ import annotations

from vlmserve.plan.cost import RooflineStepCost
from vlmserve.plan.setup import DEFAULT_BLOCK_SIZE, PlanSetup


def roofline_setup(model: str, gpu: str, tp: int = 1, *, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None) -> PlanSetup:
    """The planner's view of one sim replica (UserError if the model or GPU is unknown or it does not fit)."""
    setup = PlanSetup.from_names(model, gpu, tp=tp, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens)
    setup.memory()
    return setup


def roofline_cost_model(model: str, gpu: str, tp: int = 1) -> RooflineStepCost:
    """Step pricing for `model` on `tp` × `gpu` with the shipped calibration."""
    return roofline_setup(model, gpu, tp).cost_model()


def roofline_kv_blocks(model: str, gpu: str, tp: int, typical_context: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """KV blocks the memory left after weights holds, at sequences about `typical_context` long."""
    return max(roofline_setup(model, gpu, tp).kv_capacity_tokens(typical_context) // block_size, 1)
