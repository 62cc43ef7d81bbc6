"""Model side: HF config.json → cost terms, checked against hand-computed figures."""

from __future__ import annotations

import json

import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.models import load_model, parse_config, preset_config, preset_names


def test_every_preset_parses_and_is_roughly_its_advertised_size() -> None:
    sizes_b = {
        "meta-llama/Llama-3.1-8B-Instruct": 8.0,
        "meta-llama/Llama-3.1-70B-Instruct": 70.6,
        "openai/gpt-oss-120b": 117.0,
        "google/gemma-4-31B-it": 31.0,
        "google/gemma-4-26B-A4B-it": 26.0,
        "Qwen/Qwen3-8B": 8.2,
    }
    assert len(preset_names()) >= 7
    for name in preset_names():
        model = load_model(name)
        assert model.total_params > 1e9
        if name in sizes_b:
            assert model.total_params / 1e9 == pytest.approx(sizes_b[name], rel=0.04)


def test_dense_gqa_kv_bytes_by_hand() -> None:
    model = load_model("llama-3.1-8b")
    # 2 (K,V) × 32 layers × 8 KV heads × 128 head dim × 2 bytes
    assert model.kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert model.kv_bytes_per_token("fp8") == 65536
    assert model.kv_bytes_for_context(1000) == 131072 * 1000
    assert not model.is_moe and model.vision is None


def test_moe_with_sliding_layers_gpt_oss() -> None:
    model = load_model("openai/gpt-oss-120b")
    per_kind = model.kv_bytes_per_token_by_kind("bf16")
    # 18 full + 18 sliding layers, each 2 × 8 heads × 64 dim × 2 bytes
    assert per_kind == {"full": 18 * 2 * 8 * 64 * 2, "sliding": 18 * 2 * 8 * 64 * 2}
    # sliding layers keep at most the 128-token window
    assert model.kv_bytes_for_context(1000) == 36864 * 1000 + 36864 * 128
    assert model.num_experts == 128 and model.experts_per_token == 4
    assert model.default_weight_dtype == "mxfp4"
    assert model.active_params_per_token / 1e9 == pytest.approx(4.55, rel=0.03)
    # expected distinct experts E·(1−(1−k/E)^B)
    assert model.expected_experts_touched(1) == pytest.approx(4.0)
    assert model.expected_experts_touched(4) == pytest.approx(128 * (1 - (1 - 4 / 128) ** 4))
    assert model.expected_experts_touched(10_000) == pytest.approx(128.0)
    # a batch touching more experts streams more bytes; MXFP4 experts are about a quarter of BF16
    assert model.step_weight_bytes(64) > 3 * model.step_weight_bytes(1)
    assert model.weight_bytes("mxfp4") / 1e9 == pytest.approx(65.2, rel=0.03)
    assert model.weight_bytes("bf16") > 3 * model.weight_bytes("mxfp4")


def test_gemma4_sliding_and_global_layers() -> None:
    model = load_model("gemma-4-31b")
    per_kind = model.kv_bytes_per_token_by_kind("bf16")
    # 50 sliding layers: 16 KV heads × 256; 10 global layers: 4 KV heads × 512
    assert per_kind["sliding"] == 50 * 2 * 16 * 256 * 2 == 819200
    assert per_kind["full"] == 10 * 2 * 4 * 512 * 2 == 81920
    assert model.kv_bytes_for_context(4096) == 819200 * 1024 + 81920 * 4096
    assert model.vision is not None and model.vision.flops_per_image_token > 0


def test_gemma4_moe_with_dense_mlp_beside_experts() -> None:
    model = load_model("gemma-4-26b-a4b")
    assert model.num_experts == 128 and model.experts_per_token == 8
    assert model.expert_params == 3 * 2816 * 704
    assert model.dense_mlp_params == 30 * 3 * 2816 * 2112
    assert model.kv_bytes_per_token_by_kind() == {"full": 5 * 2 * 2 * 512 * 2, "sliding": 25 * 2 * 8 * 256 * 2}
    assert 3.0e9 < model.active_params_per_token < 4.5e9


def test_shared_kv_layers_hold_no_cache() -> None:
    model = load_model("gemma-4-e4b")
    # 42 layers, the last 18 reuse earlier KV: 24 own KV = 20 sliding + 4 global
    assert model.kv_bytes_per_token_by_kind() == {"full": 4 * 2 * 2 * 512 * 2, "sliding": 20 * 2 * 2 * 256 * 2}
    shared = [group for group in model.attention if not group.owns_kv]
    assert sum(group.count for group in shared) == 18
    # shared layers still attend: their query FLOPs count
    assert sum(group.count for group in model.attention) == 42
    assert model.lookup_only_params == 256 * 42 * 262144
    assert any("audio" in note for note in model.notes)


def test_vision_tower_cost_per_image_token() -> None:
    model = load_model("qwen3-vl-4b")
    assert model.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2
    assert model.vision is not None
    assert model.vision.patches_per_image_token == 4  # spatial merge 2 × 2
    assert 0.25e9 < model.vision.params < 0.6e9
    assert model.vision.flops_per_image_token == 2 * model.vision.params * 4


def test_sliding_window_pattern_without_layer_types() -> None:
    config = {
        "hidden_size": 1024,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
    }
    model = parse_config(config, "pattern")
    assert model.kv_bytes_per_token_by_kind() == {"full": 2 * 2 * 4 * 128 * 2, "sliding": 10 * 2 * 4 * 128 * 2}


def _broken(field: str) -> dict:
    config = preset_config("meta-llama/Llama-3.1-8B-Instruct")
    del config[field]
    return config


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads"])
def test_missing_field_names_it(field: str) -> None:
    with pytest.raises(UserError, match=rf"config.json has no '{field}' field"):
        parse_config(_broken(field), "broken")


def test_moe_without_top_k_names_the_field() -> None:
    config = preset_config("openai/gpt-oss-120b")
    del config["experts_per_token"]
    with pytest.raises(UserError, match="no 'num_experts_per_tok' field"):
        parse_config(config, "moe")


def test_nested_text_config_field_is_named_with_its_section() -> None:
    config = preset_config("google/gemma-4-31B-it")
    del config["text_config"]["hidden_size"]
    with pytest.raises(UserError, match=r"no 'text_config.hidden_size' field"):
        parse_config(config, "gemma")


def test_sliding_layers_need_a_window() -> None:
    config = preset_config("openai/gpt-oss-120b")
    del config["sliding_window"]
    with pytest.raises(UserError, match="sliding layers but no 'sliding_window'"):
        parse_config(config, "oss")


def test_bad_values_are_named() -> None:
    config = preset_config("meta-llama/Llama-3.1-8B-Instruct")
    config["hidden_size"] = "big"
    with pytest.raises(UserError, match="field 'hidden_size' is 'big'"):
        parse_config(config, "bad")
    config = preset_config("openai/gpt-oss-120b")
    config["layer_types"] = ["full_attention"] * 3
    with pytest.raises(UserError, match="layer_types' must list one entry per layer"):
        parse_config(config, "bad")


def test_config_files_and_unknown_names(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(preset_config("Qwen/Qwen3-4B")))
    assert load_model(str(path)).kv_bytes_per_token() == 147456
    assert load_model(str(tmp_path)).hidden_size == 2560  # a directory with config.json
    path.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_model(str(path))
    with pytest.raises(UserError, match="no such file"):
        load_model(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="unknown model 'no-such-model'; give a path to a config.json or one of"):
        load_model("no-such-model")


@pytest.mark.hostile("plan --model config.json whose top level, text_config or vision_config is not an object")
def test_config_sections_of_the_wrong_shape_are_one_line(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps([preset_config("Qwen/Qwen3-4B")]))
    with pytest.raises(UserError, match="config.json must be a JSON object"):
        load_model(str(path))
    config = preset_config("google/gemma-4-31B-it")
    config["text_config"] = "gemma"
    with pytest.raises(UserError, match="field 'text_config' must be an object"):
        parse_config(config, "gemma")
    config = preset_config("google/gemma-4-31B-it")
    config["vision_config"] = [1, 2]
    with pytest.raises(UserError, match="field 'vision_config' must be an object"):
        parse_config(config, "gemma")
