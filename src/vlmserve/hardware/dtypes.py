"""Storage formats for weights and the KV cache, as bytes per element.

MXFP4 stores 4-bit values with one 8-bit scale per 32 elements: 4.25 bits each.
"""

from __future__ import annotations

from vlmserve.errors import UserError

BYTES_PER_ELEMENT: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "mxfp4": 4.25 / 8.0,
}

_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "auto": "bf16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
}


def normalize_dtype(name: str, what: str = "dtype") -> str:
    """Canonical dtype name ('bf16', 'fp8', 'mxfp4'), or a UserError listing the known ones."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BYTES_PER_ELEMENT:
        known = ", ".join(BYTES_PER_ELEMENT)
        raise UserError(f"{what} '{name}' is not known; use one of: {known}")
    return key


def bytes_per_element(name: str) -> float:
    """Bytes one element takes in this format."""
    return BYTES_PER_ELEMENT[normalize_dtype(name)]
