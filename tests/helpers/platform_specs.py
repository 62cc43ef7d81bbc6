"""Specs the platform-target tests share: one with a real model folder whose recipe applies, image
limits, tensor parallelism and an autoscaling rule, so each target must show it carries them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.recipes.configs import GEMMA4_31B_IT, model_dir
from vlmserve.spec import DeploymentSpec

RULE = {
    "min_replicas": 2,
    "max_replicas": 7,
    "waiting_per_replica": 3,
    "polling_interval_s": 10,
    "scale_up_stabilization_s": 30,
    "scale_down_stabilization_s": 600,
    "scale_down_cooldown_s": 120,
    "scale_up_step": 2,
}
RECIPE_FLAGS = ("--reasoning-parser", "--tool-call-parser", "--mm-processor-kwargs")  # gemma4's recipe sets these
LOAD_S = 1800  # a model that takes half an hour to load: the startup probes must wait that long
MAX_IMAGES = 2  # below the recipe's 4 images per prompt: the spec's limit must win


def recipe_spec(tmp_path: Path, **extra: Any) -> DeploymentSpec:
    """A Gemma 4 folder (its recipe applies), TP 2, two replicas, an image cap and an autoscaling rule."""
    folder = model_dir(tmp_path, "gemma-4-31b-it", GEMMA4_31B_IT)
    return DeploymentSpec.model_validate(
        {
            "name": "radiology",
            "model": str(folder),
            "replicas": 2,
            "max_images_per_request": MAX_IMAGES,
            "max_image_bytes": 4_000_000,
            "ready_timeout_s": LOAD_S,
            "env": {"VLLM_LOGGING_LEVEL": "INFO"},
            "autoscale": RULE,
            "engine_args": {"tensor_parallel_size": 2, "max_model_len": 8192},
            **extra,
        }
    )


def keys_file(tmp_path: Path) -> str:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  - name: radiology\n    keys: [sk-radiology-secret-1]\n")
    return str(keys)
