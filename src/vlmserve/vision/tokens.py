"""How many prompt tokens an image costs a model, read from the model's own processor configuration.

VLM families turn pixels into tokens in three ways, and an estimate that ignores which one a model
uses is off by 10x either way (576 tokens per image is right for LLaVA-1.5 and nothing else):

- **fixed**: every image costs the same (LLaVA-1.5: (336/14)² = 576; Gemma 3: `mm_tokens_per_image`).
- **budget**: a soft-token budget per image, chosen per request within allowed values (Gemma 4's
  `max_soft_tokens`, 70-1120); small images use fewer tokens than the budget.
- **pixels**: tokens follow the resized pixel count (Qwen2/2.5/3-VL: the image is resized to a
  multiple of patch × merge within [min_pixels, max_pixels], one token per merge² patches).
- **tiles**: the image is rescaled to a longest edge, cut into square tiles plus one global view,
  each tile a fixed number of tokens (Idefics3, SmolVLM): the count depends on the aspect ratio.

Each estimator also says how to cap an image's resolution for that model (`downscale`): a pixel
resize, plus the processor keyword that stops the engine scaling it back up where the family
rescales every image to a fixed edge (tiles). Anything unrecognised gets a fixed fallback that
says it is one. The counts follow vLLM's processing code for each family; framing tokens around
an image are included where the family adds them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject, JSONValue

FALLBACK_IMAGE_TOKENS = 576
"""LLaVA-1.5's count, used when nothing better is known (and labelled a fallback)."""


@dataclass(frozen=True)
class Downscale:
    """How to send an image at a capped resolution: its new size and the processor kwargs to add."""

    width: int
    height: int
    mm_processor_kwargs: JSONObject = field(default_factory=dict)


def fit_within(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size with the longest side at most `max_side`, aspect ratio kept (never upscaled)."""
    longest = max(width, height)
    if longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class ImageTokenEstimator:
    """Base: a fixed count per image. Subclasses follow their family's processor."""

    tokens_per_image: int = FALLBACK_IMAGE_TOKENS
    family: str = "fallback"
    source: str = "no model configuration: a fixed 576 tokens per image (LLaVA-1.5's count)"
    """Where the numbers came from, for logs and docs (which files, which keys)."""
    is_fallback: bool = True

    def tokens(self, width: int, height: int, mm_processor_kwargs: Mapping[str, object] | None = None) -> int:
        """Prompt tokens one image of this size costs (placeholders and framing tokens)."""
        return self.tokens_per_image

    def max_useful_side(self) -> int | None:
        """Longest side past which the processor shrinks the image anyway (None: no such bound known)."""
        return None

    def downscale(self, width: int, height: int, max_side: int) -> Downscale:
        """How to send the image with its longest side at most `max_side`."""
        new_width, new_height = fit_within(width, height, max_side)
        return Downscale(new_width, new_height)

    def describe(self) -> str:
        return f"{self.family}: {self.source}"


@dataclass(frozen=True)
class SoftTokenBudget(ImageTokenEstimator):
    """Gemma-4 style: up to `budget` soft tokens per image, fewer for a small image.

    A request may pick another budget through `mm_processor_kwargs.max_soft_tokens`. Each soft
    token covers a (patch × pooling)² pixel area at most.
    """

    budget: int = 280
    patch_size: int = 16
    pooling: int = 3
    framing: int = 2  # begin- and end-of-image tokens

    def _budget(self, mm_processor_kwargs: Mapping[str, object] | None) -> int:
        chosen = (mm_processor_kwargs or {}).get("max_soft_tokens")
        return chosen if isinstance(chosen, int) and chosen > 0 else self.budget

    def tokens(self, width: int, height: int, mm_processor_kwargs: Mapping[str, object] | None = None) -> int:
        area = (self.patch_size * self.pooling) ** 2
        return min(self._budget(mm_processor_kwargs), max(1, math.ceil(width * height / area))) + self.framing

    def max_useful_side(self) -> int | None:
        return int(math.sqrt(self.budget) * self.patch_size * self.pooling) + 1

    def downscale(self, width: int, height: int, max_side: int) -> Downscale:
        new_width, new_height = fit_within(width, height, max_side)
        area = (self.patch_size * self.pooling) ** 2
        budget = min(self.budget, max(1, math.ceil(new_width * new_height / area)))
        return Downscale(new_width, new_height, {"max_soft_tokens": budget} if budget < self.budget else {})


@dataclass(frozen=True)
class PixelGrid(ImageTokenEstimator):
    """Qwen-VL style: resize to multiples of patch × merge within [min_pixels, max_pixels]."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    framing: int = 2  # vision start and end tokens

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """The processor's smart resize: (width, height) it will feed the vision tower."""
        factor = self.patch_size * self.merge_size
        new_height = round(height / factor) * factor
        new_width = round(width / factor) * factor
        if new_height * new_width > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            new_height = max(factor, math.floor(height / beta / factor) * factor)
            new_width = max(factor, math.floor(width / beta / factor) * factor)
        elif new_height * new_width < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            new_height = math.ceil(height * beta / factor) * factor
            new_width = math.ceil(width * beta / factor) * factor
        return new_width, new_height

    def tokens(self, width: int, height: int, mm_processor_kwargs: Mapping[str, object] | None = None) -> int:
        new_width, new_height = self.resized(width, height)
        return (new_width // self.patch_size) * (new_height // self.patch_size) // self.merge_size**2 + self.framing

    def max_useful_side(self) -> int | None:
        return int(math.sqrt(self.max_pixels))


@dataclass(frozen=True)
class Tiles(ImageTokenEstimator):
    """Idefics3/SmolVLM: rescale the longest edge to `longest_edge`, cut `tile`-pixel tiles, add a global view.

    The processor rescales every image to `longest_edge` (upscaling small ones), so a pixel resize
    alone changes nothing: capping the resolution also sets the processor's `size.longest_edge`.
    """

    longest_edge: int = 4 * 364
    tile: int = 364
    image_seq_len: int = 169
    splitting: bool = True

    def grid(self, width: int, height: int, longest_edge: int | None = None) -> tuple[int, int]:
        """(rows, cols) of tiles; (0, 0) when the image is one global view."""
        edge = longest_edge or self.longest_edge
        if not self.splitting:
            return 0, 0
        if width >= height:
            new_width, new_height = edge, max(1, int(edge * height / width))
        else:
            new_width, new_height = max(1, int(edge * width / height)), edge
        rows = math.ceil(math.ceil(new_height / self.tile) * self.tile / self.tile)
        cols = math.ceil(math.ceil(new_width / self.tile) * self.tile / self.tile)
        if rows * self.tile > self.tile or cols * self.tile > self.tile:
            return rows, cols
        return 0, 0

    def tokens(self, width: int, height: int, mm_processor_kwargs: Mapping[str, object] | None = None) -> int:
        size = (mm_processor_kwargs or {}).get("size")
        edge = size.get("longest_edge") if isinstance(size, dict) else None
        rows, cols = self.grid(width, height, edge if isinstance(edge, int) and edge > 0 else None)
        global_view = self.image_seq_len + 3  # fake token + global tag ... + closing fake token
        if rows == 0:
            return global_view
        # each tile: fake token + <row_r_col_c> + tokens; a newline per row and one before the global view
        return rows * cols * (self.image_seq_len + 2) + rows + 1 + global_view

    def max_useful_side(self) -> int | None:
        return self.longest_edge

    def downscale(self, width: int, height: int, max_side: int) -> Downscale:
        new_width, new_height = fit_within(width, height, max_side)
        if max_side >= self.longest_edge:
            return Downscale(new_width, new_height)
        edge = max(self.tile, (max_side // self.tile) * self.tile)
        return Downscale(new_width, new_height, {"size": {"longest_edge": edge}})


# -- reading a model directory ---------------------------------------------------------------

_PIXEL_DEFAULTS = {  # model_type -> (patch_size, merge_size)
    "qwen2_vl": (14, 2),
    "qwen2_5_vl": (14, 2),
    "qwen3_vl": (16, 2),
    "qwen3_vl_moe": (16, 2),
}
_TILE_TYPES = ("idefics3", "smolvlm")
_LLAVA_TYPES = ("llava", "llava_next", "llava_onevision", "llava_next_video")


def _read_json(path: Path) -> JSONObject:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not readable JSON ({str(err).splitlines()[0]}): fix or remove the file") from None
    return value if isinstance(value, dict) else {}


def _dict(value: JSONValue) -> JSONObject:
    return value if isinstance(value, dict) else {}


def _int(value: JSONValue, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _pixel_grid(model_type: str, pre: JSONObject) -> PixelGrid:
    patch, merge = _PIXEL_DEFAULTS[model_type]
    size = _dict(pre.get("size"))
    min_pixels = _int(pre.get("min_pixels"), _int(size.get("shortest_edge"), 56 * 56))
    max_pixels = _int(pre.get("max_pixels"), _int(size.get("longest_edge"), 28 * 28 * 1280))
    return PixelGrid(
        family=model_type,
        is_fallback=False,
        patch_size=_int(pre.get("patch_size"), patch),
        merge_size=_int(pre.get("merge_size"), merge),
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        source=f"preprocessor_config.json: min_pixels={min_pixels}, max_pixels={max_pixels}",
    )


def _tiles(model_type: str, config: JSONObject, pre: JSONObject, proc: JSONObject) -> Tiles:
    vision = _dict(config.get("vision_config"))
    tile = _int(_dict(pre.get("max_image_size")).get("longest_edge"), _int(vision.get("image_size"), 364))
    longest = _int(_dict(pre.get("size")).get("longest_edge"), 4 * tile)
    patch = _int(vision.get("patch_size"), 14)
    scale = _int(config.get("scale_factor"), 2 if model_type == "idefics3" else 4)
    seq_len = _int(proc.get("image_seq_len"), (tile // patch) ** 2 // scale**2)
    splitting = pre.get("do_image_splitting", True) is not False
    return Tiles(
        family=model_type,
        is_fallback=False,
        longest_edge=longest,
        tile=tile,
        image_seq_len=seq_len,
        splitting=splitting,
        source=f"preprocessor_config.json: longest_edge={longest}, tile={tile}; image_seq_len={seq_len}",
    )


def estimator_from_configs(config: JSONObject, preprocessor: JSONObject, processor: JSONObject) -> ImageTokenEstimator:
    """The estimator for a model given its config.json, preprocessor_config.json and processor_config.json."""
    model_type = str(config.get("model_type", "")).lower()
    nested = processor.get("image_processor")
    if not preprocessor and isinstance(nested, dict):  # newer transformers save it inside processor_config.json
        preprocessor = nested
    if model_type in _PIXEL_DEFAULTS:
        return _pixel_grid(model_type, preprocessor)
    if model_type in _TILE_TYPES:
        return _tiles(model_type, config, preprocessor, processor)
    if model_type.startswith("gemma4") or "max_soft_tokens" in processor or "max_soft_tokens" in preprocessor:
        budget = _int(processor.get("max_soft_tokens"), _int(preprocessor.get("max_soft_tokens"), 280))
        return SoftTokenBudget(
            family=model_type or "gemma4", is_fallback=False, budget=budget, source=f"processor config: max_soft_tokens={budget}"
        )
    if model_type in ("gemma3", "gemma3n"):
        count = _int(config.get("mm_tokens_per_image"), 256)
        return ImageTokenEstimator(
            tokens_per_image=count + 2, family=model_type, is_fallback=False, source=f"config.json: mm_tokens_per_image={count}"
        )
    if model_type in _LLAVA_TYPES:
        vision = _dict(config.get("vision_config"))
        image_size, patch = _int(vision.get("image_size"), 336), _int(vision.get("patch_size"), 14)
        count = _int(config.get("image_seq_length"), (image_size // patch) ** 2)
        note = "" if model_type == "llava" else " (base grid only: any-resolution tiles are not counted)"
        return ImageTokenEstimator(
            tokens_per_image=count,
            family=model_type,
            is_fallback=False,
            source=f"config.json vision_config: ({image_size}/{patch})² = {count}{note}",
        )
    return ImageTokenEstimator(
        family="fallback",
        source=f"model_type {model_type or '(none)'!r} is not a known VLM family: a fixed {FALLBACK_IMAGE_TOKENS} per image",
    )


def estimator_for_model_dir(model_dir: str | Path) -> ImageTokenEstimator:
    """The estimator for a model directory holding config.json (and its processor configs)."""
    path = Path(model_dir)
    config = _read_json(path / "config.json")
    if not config:
        return ImageTokenEstimator(source=f"{path} has no config.json: a fixed {FALLBACK_IMAGE_TOKENS} per image")
    return estimator_from_configs(
        config, _read_json(path / "preprocessor_config.json"), _read_json(path / "processor_config.json")
    )


def fallback_estimator(tokens_per_image: int = FALLBACK_IMAGE_TOKENS) -> ImageTokenEstimator:
    """A fixed count, labelled as the fallback it is."""
    return ImageTokenEstimator(
        tokens_per_image=tokens_per_image, source=f"no model configuration: a fixed {tokens_per_image} tokens per image"
    )
