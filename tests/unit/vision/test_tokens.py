"""The image token estimators agree with the families' own processors (transformers' code, run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmserve.errors import UserError
from vlmserve.vision.tokens import (
    FALLBACK_IMAGE_TOKENS,
    PixelGrid,
    SoftTokenBudget,
    Tiles,
    estimator_for_model_dir,
    estimator_from_configs,
)

SIZES = [(64, 64), (1024, 1024), (128, 32), (32, 128), (16, 16), (2000, 500), (640, 480), (10, 1000), (4000, 3000)]


def test_pixel_grid_matches_qwen2_vl_smart_resize() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    grid = PixelGrid(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    for width, height in SIZES:
        h_bar, w_bar = smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
        assert grid.resized(width, height) == (w_bar, h_bar)
        assert grid.tokens(width, height) == (h_bar // 14) * (w_bar // 14) // 4 + 2


def _tiny_idefics3(tmp_path: Path, longest_edge: int = 128, tile: int = 64, seq_len: int = 4) -> Path:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "idefics3", "scale_factor": 2, "vision_config": {"image_size": tile, "patch_size": 16}})
    )
    (tmp_path / "processor_config.json").write_text(
        json.dumps(
            {
                "image_seq_len": seq_len,
                "image_processor": {
                    "size": {"longest_edge": longest_edge},
                    "max_image_size": {"longest_edge": tile},
                    "do_image_splitting": True,
                },
            }
        )
    )
    return tmp_path


def test_tiles_match_idefics3_processor_patch_counts(tmp_path: Path) -> None:
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    processor = Idefics3ImageProcessorPil(size={"longest_edge": 128}, max_image_size={"longest_edge": 64})
    estimator = estimator_for_model_dir(_tiny_idefics3(tmp_path))
    assert isinstance(estimator, Tiles) and not estimator.is_fallback
    for width, height in SIZES:
        patches, rows, cols = processor.get_number_of_image_patches(height, width, {})
        assert estimator.grid(width, height) == (rows, cols), (width, height)
        expected_image_tokens = max(patches, 1) * 4
        framing = (2 * rows * cols + rows + 1 + 3) if rows else 3
        assert estimator.tokens(width, height) == expected_image_tokens + framing


def test_tiles_downscale_sets_the_processor_edge(tmp_path: Path) -> None:
    estimator = estimator_for_model_dir(_tiny_idefics3(tmp_path))
    plan = estimator.downscale(640, 480, 64)
    assert (plan.width, plan.height) == (64, 48)
    assert plan.mm_processor_kwargs == {"size": {"longest_edge": 64}}
    assert estimator.tokens(64, 48, plan.mm_processor_kwargs) < estimator.tokens(640, 480)
    assert estimator.downscale(640, 480, 4096).mm_processor_kwargs == {}  # no cap below the model's own


def test_embedded_model_is_read_as_tiles() -> None:
    from vlmserve.engines import embedded

    estimator = estimator_from_configs(
        {
            "model_type": "idefics3",
            "scale_factor": embedded.SCALE_FACTOR,
            "vision_config": {"image_size": embedded.IMAGE_SIZE, "patch_size": embedded.PATCH_SIZE},
        },
        {"size": {"longest_edge": embedded.IMAGE_LONGEST_EDGE}, "max_image_size": {"longest_edge": embedded.IMAGE_SIZE}},
        {},
    )
    assert isinstance(estimator, Tiles) and estimator.image_seq_len == embedded.IMAGE_SEQ_LEN
    assert estimator.tokens(64, 64) == 34  # 5 views x 4 tokens + framing: what vLLM's usage adds for one image


def test_gemma4_budget_and_per_request_override() -> None:
    estimator = estimator_from_configs({"model_type": "gemma4"}, {}, {"max_soft_tokens": 280})
    assert isinstance(estimator, SoftTokenBudget)
    assert estimator.tokens(2000, 2000) == 280 + 2
    assert estimator.tokens(2000, 2000, {"max_soft_tokens": 70}) == 70 + 2
    assert estimator.tokens(48, 48) == 1 + 2  # a tiny image uses fewer than the budget
    assert estimator.downscale(2000, 2000, 240).mm_processor_kwargs == {"max_soft_tokens": 25}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"model_type": "llava", "vision_config": {"image_size": 336, "patch_size": 14}}, 576),
        ({"model_type": "gemma3", "mm_tokens_per_image": 256}, 258),
    ],
)
def test_fixed_families(config: dict[str, object], expected: int) -> None:
    estimator = estimator_from_configs(config, {}, {})
    assert estimator.tokens(10, 10) == expected and not estimator.is_fallback


def test_qwen_reads_size_keys_of_newer_processors() -> None:
    estimator = estimator_from_configs(
        {"model_type": "qwen3_vl"}, {"size": {"shortest_edge": 65536, "longest_edge": 16777216}}, {}
    )
    assert isinstance(estimator, PixelGrid) and estimator.patch_size == 16 and estimator.max_pixels == 16777216


def test_unknown_family_and_missing_config_fall_back_and_say_so(tmp_path: Path) -> None:
    unknown = estimator_from_configs({"model_type": "llama"}, {}, {})
    assert unknown.is_fallback and unknown.tokens(1, 1) == FALLBACK_IMAGE_TOKENS and "'llama'" in unknown.describe()
    missing = estimator_for_model_dir(tmp_path)
    assert missing.is_fallback and "no config.json" in missing.describe()


def test_hostile_config_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match=r"config.json: not readable JSON .*fix or remove the file"):
        estimator_for_model_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": -5, "max_pixels": "many", "patch_size": True}))
    estimator = estimator_for_model_dir(tmp_path)  # nonsense values fall back to the family's defaults
    assert isinstance(estimator, PixelGrid) and estimator.min_pixels == 56 * 56 and estimator.patch_size == 14
