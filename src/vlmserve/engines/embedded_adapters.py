"""Deterministic LoRA adapters for the embedded tiny VLM, made by vlmserve like the model itself.

Fine-tuned adapters are how this project's users ship their models (one per clinic, per language),
so serving, routing, limiting and benchmarking adapters must run for real with no hub. Adapter `i`
is a PEFT-format directory (`adapter_config.json` + `adapter_model.safetensors`) with random
low-rank weights from its own seed, on every projection of the text tower's two layers (q, k, v, o,
gate, up, down), never the vision tower (vLLM applies LoRA to the language model of VLMs).

The weights are deliberately large: the update B·A·(alpha/r) of each projection has about the size
of the base weight itself (std ~0.05 against the base's 0.02), so at temperature 0 each adapter's
tokens differ from the base model's and from every other adapter's — a request routed to the wrong
adapter shows in its answer (tests/e2e/test_embedded_adapters.py checks this on the real engine).
Written atomically under the cache directory beside the model, keyed by the model's version.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlmserve.engines import embedded
from vlmserve.errors import UserError

ADAPTER_VERSION = "v1"
"""Bump when anything below changes what is written, so cached adapters are rebuilt."""

ADAPTER_RANK = 8
"""The rank of every embedded adapter: vLLM's smallest `max_lora_rank` above 1 takes it."""
ADAPTER_ALPHA = 16
"""lora_alpha: the update is scaled by alpha / rank = 2."""
ADAPTER_INIT_STD = 0.1
"""Std of A and B entries: B·A·2 has entries of std 2·sqrt(8)·0.1² ≈ 0.057, above the base's 0.02."""
ADAPTER_SEED_BASE = embedded.SEED + 7919
"""Adapter i draws from seed ADAPTER_SEED_BASE + i: the same bytes on every machine."""
MAX_EMBEDDED_ADAPTERS = 64
"""How many distinct embedded adapters vlmserve makes (enough for any many-adapter test or bench)."""

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
EMBEDDED_ADAPTER_PREFIX = "embedded:"
"""A spec's `lora_modules` value `embedded:3` means: the embedded model's adapter 3, made on first use."""


def adapter_name(index: int) -> str:
    """The served name bench and the docs use for embedded adapter `index`."""
    return f"tiny-lora-{index}"


def adapters_root() -> Path:
    """Where the embedded adapters are cached (beside the model they belong to)."""
    return embedded.tiny_model_path().parent / f"{embedded.TINY_MODEL_DIRNAME}-lora-{ADAPTER_VERSION}"


def adapter_path(index: int) -> Path:
    """Adapter `index`'s directory (it may not exist yet)."""
    return adapters_root() / f"adapter-{index}"


def is_complete(adapter_dir: Path) -> bool:
    """True when an adapter directory was fully written (the weights are written before the config)."""
    return (adapter_dir / "adapter_config.json").is_file() and (adapter_dir / "adapter_model.safetensors").is_file()


def ensure_adapter(index: int) -> Path:
    """Adapter `index`, made first if needed (safe across processes, like the model)."""
    if not 0 <= index < MAX_EMBEDDED_ADAPTERS:
        raise UserError(f"embedded adapter {index} does not exist; use 0..{MAX_EMBEDDED_ADAPTERS - 1}")
    target = adapter_path(index)
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with embedded._file_lock(target.parent / f".adapter-{index}.lock"):
        if not is_complete(target):
            make_adapter(index, target)
    return target


def ensure_adapters(count: int) -> dict[str, Path]:
    """The first `count` embedded adapters by served name (tiny-lora-0, ...), made if needed."""
    return {adapter_name(index): ensure_adapter(index) for index in range(count)}


def resolve_adapter_path(value: str) -> Path:
    """A spec's adapter path: `embedded:N` (made here on first use) or a directory as given."""
    if value.startswith(EMBEDDED_ADAPTER_PREFIX):
        index_text = value.removeprefix(EMBEDDED_ADAPTER_PREFIX)
        if not index_text.isdigit():
            raise UserError(f"'{value}': write an embedded adapter as embedded:N (N in 0..{MAX_EMBEDDED_ADAPTERS - 1})")
        return ensure_adapter(int(index_text))
    return Path(value).expanduser().resolve()


def make_adapter(index: int, out_dir: Path) -> Path:
    """Write adapter `index` to `out_dir` atomically (staged in a sibling directory, then renamed)."""
    return embedded.write_directory_atomically(
        Path(out_dir).expanduser().resolve(), lambda staging: _write_adapter(index, staging)
    )


def adapter_tensors(index: int) -> dict[str, "object"]:
    """PEFT-named lora_A / lora_B tensors (bfloat16, like the model) of adapter `index`."""
    import torch

    generator = torch.Generator().manual_seed(ADAPTER_SEED_BASE + index)
    tensors: dict[str, object] = {}
    for layer in range(embedded.TEXT_LAYERS):
        for module, (out_features, in_features) in _projection_shapes().items():
            group = "self_attn" if module in _ATTENTION else "mlp"
            stem = f"base_model.model.model.text_model.layers.{layer}.{group}.{module}"
            a = torch.randn(ADAPTER_RANK, in_features, generator=generator) * ADAPTER_INIT_STD
            b = torch.randn(out_features, ADAPTER_RANK, generator=generator) * ADAPTER_INIT_STD
            tensors[f"{stem}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
            tensors[f"{stem}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
    return tensors


def _projection_shapes() -> dict[str, tuple[int, int]]:
    """(out, in) of each text-tower projection, from the embedded model's shape constants."""
    head_dim = embedded.TEXT_HIDDEN // embedded.TEXT_HEADS
    kv = embedded.TEXT_KV_HEADS * head_dim
    hidden, inner = embedded.TEXT_HIDDEN, embedded.TEXT_INTERMEDIATE
    return {
        "q_proj": (hidden, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, hidden),
        "gate_proj": (inner, hidden),
        "up_proj": (inner, hidden),
        "down_proj": (hidden, inner),
    }


def _write_adapter(index: int, adapter_dir: Path) -> None:
    """The weights first, the config last (is_complete reads both)."""
    from safetensors.torch import save_file

    save_file(adapter_tensors(index), str(adapter_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(embedded.tiny_model_path()),
        "r": ADAPTER_RANK,
        "lora_alpha": ADAPTER_ALPHA,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGET_MODULES),
        "inference_mode": True,
        "vlmserve": {
            "made_by": "vlmserve",
            "version": ADAPTER_VERSION,
            "index": index,
            "seed": ADAPTER_SEED_BASE + index,
            "note": "random weights, large on purpose",
        },
    }
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
