"""The embedded tiny VLM: a real Idefics3 (SmolVLM-family) model that vlmserve makes itself.

There is no model hub on the machines vlmserve must run on, yet every part of the path
(engine start, image preprocessing, image tokens in the prompt, streaming, usage counts,
/metrics) must be exercised for real. So vlmserve writes a tiny model on first use:
random weights from a fixed seed, a byte-level BPE tokenizer trained locally on generated
text, the Idefics3 special tokens, a chat template that places images, and a real Idefics3
image processor config. Its words are gibberish by design; everything else is real.

The shape is chosen to load in vLLM's CPU build: head_dim = 256 / 4 = 64 (the CPU attention
backend needs head_dim >= 64), 2 text layers, a 2-layer vision tower at 64x64 pixels with
16x16 patches. The model is cached under the user cache directory and written atomically
(a temporary directory renamed into place), so a killed run never leaves half a model.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from vlmserve import paths
from vlmserve.errors import UserError

if TYPE_CHECKING:
    from transformers import Idefics3Config, Idefics3Processor, PreTrainedTokenizerFast

TINY_MODEL_VERSION = "v1"
"""Bump when anything below changes what is written, so caches are rebuilt, not reused."""

TINY_MODEL_DIRNAME = f"tiny-idefics3-{TINY_MODEL_VERSION}"
SEED = 20240611

# Text tower (Llama): head_dim = HIDDEN / HEADS = 64, the CPU attention backend's minimum.
TEXT_HIDDEN = 256
TEXT_INTERMEDIATE = 512
TEXT_LAYERS = 2
TEXT_HEADS = 4
TEXT_KV_HEADS = 2
MAX_POSITIONS = 4096

# Vision tower (SigLIP-like): 64x64 pixels, 16x16 patches -> 16 patches -> 4 tokens after
# the 2x pixel shuffle.
VISION_HIDDEN = 128
VISION_INTERMEDIATE = 256
VISION_LAYERS = 2
VISION_HEADS = 2
IMAGE_SIZE = 64
PATCH_SIZE = 16
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
# Images are split into tiles of IMAGE_SIZE plus one global view; the longest edge is
# first resized to at most this, so an image costs at most (2x2 + 1) * IMAGE_SEQ_LEN tokens.
IMAGE_LONGEST_EDGE = 2 * IMAGE_SIZE

BPE_VOCAB_SIZE = 2048
BOS_TOKEN = "<|im_start|>"
PAD_TOKEN = "<|im_end|>"
UNK_TOKEN = "<unk>"
END_OF_UTTERANCE = "<end_of_utterance>"
IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
ROW_COL_TOKENS = [f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)]
SPECIAL_TOKENS = [
    UNK_TOKEN,
    BOS_TOKEN,
    PAD_TOKEN,
    END_OF_UTTERANCE,
    FAKE_IMAGE_TOKEN,
    IMAGE_TOKEN,
    GLOBAL_IMAGE_TOKEN,
    *ROW_COL_TOKENS,
]

# SmolVLM-style template. It accepts both plain-string content and OpenAI-style content
# parts, and places one <image> per image part (the processor expands it into tiles).
CHAT_TEMPLATE = (
    "<|im_start|>"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}"
    "{{ ': ' + message['content'] }}"
    "{% else %}"
    "{% if message['content'] and message['content'][0]['type'] in ['image', 'image_url'] %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ['image', 'image_url'] %}{{ '<image>' }}{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

_SYLLABLES = (
    "ka ro mi te lu sa no vi da pe zo ri an el on ur ix ba ce fo gu hy ja ke "
    "lo mu ne po qu re si tu va we xe yo ze th sh ch st pr tr gr bl cl fl"
).split()
_WORDS_ENGLISH = (
    "the a an of to in is it that for on with as was at by this from be are or image "
    "picture photo what describe show see tooth x-ray patient clinic question answer "
    "please tell me about color red green blue black white left right top bottom "
    "number one two three four five model server request token first last fast slow"
).split()


def tiny_model_path() -> Path:
    """The cached embedded model's directory (it may not exist yet), under vlmserve.paths.cache_dir."""
    return paths.cache_dir() / TINY_MODEL_DIRNAME


def is_complete(model_dir: Path) -> bool:
    """True when a model directory was fully written (the marker is written last)."""
    return (model_dir / "vlmserve-tiny.json").is_file() and (model_dir / "config.json").is_file()


def ensure_tiny_model() -> Path:
    """Return the cached embedded model, making it first if needed (safe across processes)."""
    target = tiny_model_path()
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{TINY_MODEL_DIRNAME}.lock"):
        if not is_complete(target):  # another process may have made it while we waited
            make_tiny_model(target)
    return target


def make_tiny_model(out_dir: Path) -> Path:
    """Write the tiny VLM to `out_dir` atomically: build in a sibling temp dir, then rename."""
    out_dir = Path(out_dir).expanduser().resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file; give a directory path for the model")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_complete(out_dir):
        raise UserError(f"{out_dir} exists and is not empty; choose a new directory or remove it")
    return write_directory_atomically(out_dir, _write_model)


def write_directory_atomically(out_dir: Path, write: Callable[[Path], None]) -> Path:
    """`write` fills a sibling temp directory, which then replaces `out_dir` in one rename: a process
    killed midway leaves the old directory or none, never half of one."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; a model dir is ordinary data
        write(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _write_model(model_dir: Path) -> None:
    """Build tokenizer, processor and random-weight model, and save them with transformers."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    processor = _build_processor()
    tokenizer = processor.tokenizer
    config = _model_config(tokenizer)
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration(config).to(torch.bfloat16).eval()
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(model_dir, safe_serialization=True)
    processor.save_pretrained(model_dir)
    marker = {
        "made_by": "vlmserve",
        "version": TINY_MODEL_VERSION,
        "seed": SEED,
        "note": "random weights: the words are gibberish by design; everything else is real",
        "files_sha256": _digest_files(model_dir),
    }
    (model_dir / "vlmserve-tiny.json").write_text(json.dumps(marker, indent=2) + "\n")


def _build_processor() -> Idefics3Processor:
    """The trained tokenizer with the Idefics3 specials, and the image processor, as one processor."""
    from transformers import Idefics3Processor, PreTrainedTokenizerFast
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=END_OF_UTTERANCE,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[FAKE_IMAGE_TOKEN, IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN, *ROW_COL_TOKENS],
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": IMAGE_LONGEST_EDGE}, max_image_size={"longest_edge": IMAGE_SIZE}, do_image_splitting=True
    )
    return Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE
    )


def _model_config(tokenizer: PreTrainedTokenizerFast) -> Idefics3Config:
    """The tiny model's shape: a small Llama text model behind a small SigLIP vision tower."""
    from transformers import Idefics3Config

    config = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": TEXT_HIDDEN,
            "intermediate_size": TEXT_INTERMEDIATE,
            "num_hidden_layers": TEXT_LAYERS,
            "num_attention_heads": TEXT_HEADS,
            "num_key_value_heads": TEXT_KV_HEADS,
            "max_position_embeddings": MAX_POSITIONS,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        vision_config={
            "hidden_size": VISION_HIDDEN,
            "intermediate_size": VISION_INTERMEDIATE,
            "num_hidden_layers": VISION_LAYERS,
            "num_attention_heads": VISION_HEADS,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        scale_factor=SCALE_FACTOR,
        image_token_id=int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    return config


def _train_tokenizer():  # -> tokenizers.Tokenizer
    """A byte-level BPE trained on deterministic generated text, with the Idefics3 specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # No BOS is added when tokenizing: the chat template writes <|im_start|> itself.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    return tokenizer


def _training_text(lines: int = 4000) -> Iterator[str]:
    """Deterministic pseudo-text: English-ish function words mixed with made-up words."""
    rng = random.Random(SEED)
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(4, 16)):
            if rng.random() < 0.5:
                words.append(rng.choice(_WORDS_ENGLISH))
            else:
                words.append("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))))
        sentence = " ".join(words)
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 9999)}"
        yield sentence.capitalize() + rng.choice([".", "?", "!", ","])


def _digest_files(model_dir: Path) -> dict[str, str]:
    """sha256 of every written file, so two builds can be compared for determinism."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(model_dir.iterdir()) if path.is_file()}


@contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive lock so parallel test workers or helpers build the model only once."""
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
