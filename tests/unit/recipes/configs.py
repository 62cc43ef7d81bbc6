"""Minimal, plausible config.json files for the families the recipes know (a directory holding only
config.json is what `vlmserve recipe show` must handle: no weights, no processor files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GEMMA4_31B_IT: dict[str, Any] = {  # dense, vision, no audio_config
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "hidden_size": 5376,
        "num_hidden_layers": 60,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "vocab_size": 262144,
    },
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152, "patch_size": 16, "pooling_kernel_size": 3},
    "torch_dtype": "bfloat16",
}

GEMMA4_E4B: dict[str, Any] = {  # on-device, vision and audio
    **GEMMA4_31B_IT,
    "text_config": {"model_type": "gemma4_text", "hidden_size": 2560, "num_hidden_layers": 42},
    "audio_config": {"model_type": "gemma4_audio", "hidden_size": 1536},
}

QWEN3_VL: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096},
    "vision_config": {"model_type": "qwen3_vl", "patch_size": 16, "spatial_merge_size": 2},
}

IDEFICS3: dict[str, Any] = {
    "architectures": ["Idefics3ForConditionalGeneration"],
    "model_type": "idefics3",
    "scale_factor": 2,
    "text_config": {"model_type": "llama", "hidden_size": 2048},
    "vision_config": {"model_type": "idefics3_vision", "image_size": 364, "patch_size": 14},
}

UNKNOWN: dict[str, Any] = {"architectures": ["FancyNewVLM"], "model_type": "fancy_vlm", "vision_config": {"patch_size": 14}}


def model_dir(root: Path, name: str, config: dict[str, Any]) -> Path:
    """A directory named `name` holding config.json only."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory
