"""Step costs from measured vLLM kernels (aiconfigurator-core's tables), the roofline as a labelled fallback.

- `locate`: which table file prices an op on a GPU, at which vLLM version;
- `tables`: the tables loaded (lazily, cached) as curves;
- `interp`: log-space interpolation and roofline-scaled extrapolation;
- `quant`: which kernel a weight format runs as on a GPU;
- `roofline_ops`: per-kernel roofline (fallback and extrapolation scale);
- `ops`: one pricer per kernel family, each with its `Source`;
- `vision_shape`: the ViT's shapes from the model's vision config;
- `step_cost`: `MeasuredStepCost`, the StepCostModel that sums them.
"""

from vlmserve.hardware.kernels.locate import covers, data_root
from vlmserve.hardware.kernels.step_cost import MeasuredStepCost

__all__ = ["MeasuredStepCost", "covers", "data_root"]
