"""Storage formats for weights and the KV cache, as bytes per element.

Weight formats are named the same way everywhere in the project:

- bf16 / fp16: two bytes.
- fp8: one byte (per-tensor, per-channel or 128×128 block scales are negligible).
- int8: one byte plus an fp16 scale per group (GPTQ 8-bit, weight-only).
- int4: AWQ/GPTQ W4A16 — half a byte plus an fp16 scale per group (and a 4-bit zero point
  per group for asymmetric AWQ); the group is the checkpoint's `group_size`, 128 when unsaid.
- nvfp4: half a byte plus one fp8 (E4M3) scale per 16 elements: 4.5 bits each.
- mxfp4: half a byte plus one 8-bit (E8M0) scale per 32 elements: 4.25 bits each.

The KV cache holds bf16/fp16 or fp8 only (vLLM's `--kv-cache-dtype`).
"""

from __future__ import annotations

from vlmserve.errors import UserError

DEFAULT_QUANT_GROUP_SIZE = 128
"""AWQ/GPTQ group size when the checkpoint does not say (the common default)."""

BYTES_PER_ELEMENT: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0 + 2.0 / DEFAULT_QUANT_GROUP_SIZE,
    "int4": 0.5 + 2.0 / DEFAULT_QUANT_GROUP_SIZE,
    "nvfp4": 0.5 + 1.0 / 16.0,
    "mxfp4": 4.25 / 8.0,
}

KV_CACHE_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8")
"""Formats vLLM can keep the KV cache in."""

WEIGHT_ONLY_FORMATS: frozenset[str] = frozenset({"int8", "int4", "mxfp4"})
"""Formats vLLM always runs weight-only (dequantized into BF16 GEMMs), on every GPU."""

_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "auto": "bf16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
    "w4a16": "int4",
    "awq": "int4",
    "gptq": "int4",
    "fp4": "nvfp4",
}


def normalize_dtype(name: str, what: str = "dtype") -> str:
    """Canonical weight-format name (bf16, fp16, fp8, int8, int4, nvfp4, mxfp4), or a one-line UserError."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BYTES_PER_ELEMENT:
        known = ", ".join(BYTES_PER_ELEMENT)
        raise UserError(f"{what} '{name}' is not known; use one of: {known}")
    return key


def normalize_kv_dtype(name: str, what: str = "KV cache dtype") -> str:
    """Canonical KV-cache format (bf16, fp16, fp8); 4-bit formats are weight-only and refused here."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in KV_CACHE_DTYPES:
        raise UserError(f"{what} '{name}' is not known; use one of: {', '.join(KV_CACHE_DTYPES)}")
    return key


def bytes_per_element(name: str) -> float:
    """Bytes one element takes in this format (group-quantized formats at their default group)."""
    return BYTES_PER_ELEMENT[normalize_dtype(name)]


def weight_bytes_per_param(name: str, group_size: int | None = None, zero_point: bool = False) -> float:
    """Bytes per weight in a checkpoint format, with the checkpoint's own group size for int4/int8.

    int4/int8 carry an fp16 scale per `group_size` weights, plus a packed 4-bit zero point
    per group when the scheme is asymmetric (AWQ's default). Other formats ignore the group.
    """
    dtype = normalize_dtype(name, "weight dtype")
    if dtype not in ("int4", "int8"):
        return BYTES_PER_ELEMENT[dtype]
    group = group_size or DEFAULT_QUANT_GROUP_SIZE
    base = 0.5 if dtype == "int4" else 1.0
    zero = (0.5 if dtype == "int4" else 1.0) / group if zero_point else 0.0
    return base + 2.0 / group + zero
