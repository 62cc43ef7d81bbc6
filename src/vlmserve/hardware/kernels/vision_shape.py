"""The vision encoder's shapes (widths, depth, heads), read from a model's `vision_config`.

The roofline prices the vision tower from its parameter count; measured kernels need its
shapes: the ViT's hidden width, MLP width, depth, heads and head size, and how many patches
merge into one language-model token. They are read from the same config.json (or preset) the
model came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmserve.errors import UserError
from vlmserve.hardware.jsonfile import read_json_file
from vlmserve.hardware.models import preset_config, resolve_preset


@dataclass(frozen=True)
class VisionShape:
    """One ViT: `layers` blocks of width `hidden`, MLP `intermediate`, `heads` × `head_dim` attention."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    patches_per_token: int
    out_hidden: int

    @property
    def head_dim(self) -> int:
        return self.hidden // max(self.heads, 1)

    @property
    def merged(self) -> int:
        """Width of the merged patch group the projector reads."""
        return self.hidden * self.patches_per_token


def _int(section: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = section.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def vision_shape(config: dict[str, Any]) -> VisionShape | None:
    """The ViT shapes of a config.json, or None when it has no vision tower or lacks a width, depth or heads."""
    vision = config.get("vision_config") if isinstance(config, dict) else None
    if not isinstance(vision, dict):
        return None
    hidden = _int(vision, "hidden_size", "embed_dim")
    layers = _int(vision, "num_hidden_layers", "depth")
    heads = _int(vision, "num_attention_heads", "num_heads")
    if not (hidden and layers and heads):
        return None
    merge = _int(vision, "spatial_merge_size", "pooling_kernel_size") or 1
    return VisionShape(
        hidden=hidden,
        intermediate=_int(vision, "intermediate_size") or 4 * hidden,
        layers=layers,
        heads=heads,
        patches_per_token=merge * merge,
        out_hidden=_int(vision, "out_hidden_size") or hidden,
    )


def raw_config_or_none(spec: str) -> dict[str, Any] | None:
    """The config.json behind a model spec (preset name, file or directory), resolved as `load_model` does;
    None where it cannot be read (the caller has already loaded the model, or reports its own error)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        if path.suffix == ".json" or path.exists():
            data = read_json_file(path, "file", "give a config.json path or a preset name")
            return data if isinstance(data, dict) else None
    except UserError:
        return None
    canonical = resolve_preset(spec)
    return preset_config(canonical) if canonical else None
