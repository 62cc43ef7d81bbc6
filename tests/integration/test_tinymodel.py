"""The embedded tiny VLM: deterministic, complete, cached, and a real Idefics3 model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vlmserve.engines import embedded as tinymodel
from vlmserve.errors import UserError


@pytest.fixture(scope="module")
def made_twice(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return tinymodel.make_tiny_model(root / "a"), tinymodel.make_tiny_model(root / "b")


def test_make_is_deterministic(made_twice: tuple[Path, Path]) -> None:
    first, second = made_twice
    digests = [json.loads((path / "vlmserve-tiny.json").read_text())["files_sha256"] for path in made_twice]
    assert digests[0] == digests[1]
    assert {"config.json", "model.safetensors", "tokenizer.json", "processor_config.json"} <= set(digests[0])
    assert not list(first.parent.glob(".*tmp-*")), "the staging directory must be renamed away"


def test_layout_fits_the_cpu_engine(made_twice: tuple[Path, Path]) -> None:
    config = json.loads((made_twice[0] / "config.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert text["hidden_size"] // text["num_attention_heads"] >= 64  # CPU attention needs head_dim >= 64
    assert (text["num_hidden_layers"], text["num_key_value_heads"]) == (2, 2)
    assert config["vision_config"]["image_size"] == 64 and config["vision_config"]["patch_size"] == 16


def test_processor_places_image_tokens(made_twice: tuple[Path, Path]) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(made_twice[0])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>User:<image>What is this?") and prompt.endswith("Assistant:")
    encoded = processor(text=prompt, images=[Image.new("RGB", (64, 64), "red")])
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    # a 64x64 image: 2x2 tiles + a global view, 4 tokens each
    assert list(encoded["input_ids"][0]).count(image_id) == 5 * tinymodel.IMAGE_SEQ_LEN
    assert "<global-img>" in processor.tokenizer.decode(encoded["input_ids"][0])
    plain = processor.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert plain == "<|im_start|>User: hi<end_of_utterance>\nAssistant:"


def test_tokenizer_round_trips_text(made_twice: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(made_twice[0])
    text = "Describe the x-ray of tooth 36, please!"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text)  # BPE merges, not one token per byte


def test_ensure_uses_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLMSERVE_CACHE", str(tmp_path / "cache"))
    made = tinymodel.ensure_tiny_model()
    assert made == tmp_path / "cache" / tinymodel.TINY_MODEL_DIRNAME
    assert tinymodel.is_complete(made)
    stamp = (made / "model.safetensors").stat().st_mtime_ns
    assert tinymodel.ensure_tiny_model() == made
    assert (made / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_refuses_non_empty_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as caught:
        tinymodel.make_tiny_model(tmp_path)
    assert "not empty" in caught.value.message
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_cli_make_tiny(vlmserve_cmd: list[str], tmp_path: Path) -> None:
    out = tmp_path / "model"
    done = subprocess.run([*vlmserve_cmd, "model", "make-tiny", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out.resolve())
    assert tinymodel.is_complete(out)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    done = subprocess.run([*vlmserve_cmd, "model", "make-tiny", "--out", str(taken)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "not empty" in done.stderr and "Traceback" not in done.stderr
