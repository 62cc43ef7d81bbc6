"""The roofline as the sim engine's clock: `vlmserve engine sim --model M --gpu G --tp N`.

The sim engine asks for two things: a StepCostModel to time its steps and the number of
KV blocks its cache holds. Both come from the same PlanSetup the planner simulates, so
a gateway or an alert rule can be tried against "Gemma 4 31B on two H100s" on a laptop.
"""

from __future__ import annotations

from vlmserve.errors import UserError
from vlmserve.hardware.cost import RooflineStepCost
from vlmserve.hardware.setup import DEFAULT_BLOCK_SIZE, PlanSetup
from vlmserve.sched.parametric_cost import DEFAULT_PROFILE, get_profile
from vlmserve.sched.step_cost import StepCostModel


def roofline_setup(
    model: str, gpu: str, tp: int = 1, *, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None
) -> PlanSetup:
    """The planner's view of one sim replica (UserError if the model or GPU is unknown or it does not fit)."""
    setup = PlanSetup.from_names(model, gpu, tp=tp, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    setup.memory()
    return setup


def roofline_cost_model(model: str, gpu: str, tp: int = 1) -> RooflineStepCost:
    """Step pricing for `model` on `tp` × `gpu` with the shipped calibration, on the roofline
    (the sim engine's clock stays the roofline whatever `plan --cost-model` picks)."""
    return roofline_setup(model, gpu, tp).roofline_cost_model()


def roofline_kv_blocks(model: str, gpu: str, tp: int, typical_context: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """KV blocks the memory left after weights holds, at sequences about `typical_context` long."""
    return max(roofline_setup(model, gpu, tp).kv_capacity_tokens(typical_context) // block_size, 1)


def make_step_cost_model(
    profile: str | None = None, *, model: str | None = None, gpu: str | None = None, tp: int = 1
) -> StepCostModel:
    """The one place a sim engine's step-cost model is chosen.

    A profile name maps to a ParametricStepCost; `gpu` (with `model` a planner preset or
    config.json, and `tp`) prices steps with the planner's roofline model instead.
    """
    if gpu is not None:
        if profile:
            raise UserError("--profile and --gpu exclude each other; pick one timing model")
        return roofline_cost_model(model or "", gpu, tp)
    return get_profile(profile or DEFAULT_PROFILE)
