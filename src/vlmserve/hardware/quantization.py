"""A checkpoint's `quantization_config` → the weight format vLLM will run, or a one-line refusal.

vLLM picks its kernels from the checkpoint, so the planner reads the same fields:

- `fp8` (and compressed-tensors float 8-bit, ModelOpt FP8): every decoder linear layer in fp8.
- `awq` / `gptq` (and their `_marlin` variants, compressed-tensors int 4-bit): int4 W4A16 with the
  checkpoint's `group_size`; 8-bit GPTQ is int8 weight-only.
- `modelopt` NVFP4 / compressed-tensors `nvfp4-pack-quantized`: nvfp4 (fp8 scale per 16).
- `mxfp4` (gpt-oss): the routed experts only; attention stays BF16.

Anything else — an unknown method, a bit width other than 4 or 8, an integer 8-bit W8A8
scheme — is refused: pricing it as another format would be silently wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject, JSONValue

KNOWN_METHODS = ("fp8", "awq", "gptq", "awq_marlin", "gptq_marlin", "compressed-tensors", "modelopt", "mxfp4")

PER_CHANNEL_GROUP = 1 << 20
"""Stand-in group size for per-channel scales (group_size -1): one scale per row, negligible bytes."""


@dataclass(frozen=True)
class QuantScheme:
    """The weight format a checkpoint's decoder linear layers are stored (and run) in."""

    dtype: str
    """Project-wide weight-format name: fp8, int8, int4, nvfp4 or mxfp4."""
    method: str
    """The checkpoint's quant_method, for messages and `--explain`."""
    group_size: int | None = None
    zero_point: bool = False
    attention_quantized: bool = True
    """False when only the MLP/expert weights are quantized (MXFP4 checkpoints)."""


def _refuse(source: str, what: str) -> UserError:
    return UserError(f"{source}: {what}; vlmserve prices bf16, fp8, int4 (AWQ/GPTQ), nvfp4 and mxfp4 checkpoints")


def _group(value: JSONValue) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return PER_CHANNEL_GROUP if value <= 0 else int(value)


def _int_scheme(bits: JSONValue, method: str, source: str, group: JSONValue, zero_point: bool) -> QuantScheme:
    if bits == 4:
        return QuantScheme("int4", method, _group(group), zero_point)
    if bits == 8:
        return QuantScheme("int8", method, _group(group), zero_point)
    raise _refuse(source, f"quantization_config.bits is {bits!r} for '{method}'; only 4 and 8 are priced")


def _compressed_tensors(quant: JSONObject, source: str) -> QuantScheme:
    """compressed-tensors: read the first config group's weight scheme (format + bits + type)."""
    fmt = str(quant.get("format", "")).lower()
    groups = quant.get("config_groups") or {}
    weights: JSONObject = {}
    if isinstance(groups, dict):
        for group in groups.values():
            group_weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(group, dict) and isinstance(group_weights, dict):
                weights = group_weights
                fmt = str(group.get("format") or fmt).lower()
                break
    bits = weights.get("num_bits")
    kind = str(weights.get("type", "")).lower()
    if "nvfp4" in fmt or (bits == 4 and kind == "float"):
        return QuantScheme("nvfp4", "compressed-tensors", 16)
    if bits == 8 and kind == "float":
        return QuantScheme("fp8", "compressed-tensors")
    if kind == "int" and bits in (4, 8):
        activations = None
        for group in groups.values() if isinstance(groups, dict) else []:
            if isinstance(group, dict):
                activations = group.get("input_activations")
                break
        if bits == 8 and activations:
            raise _refuse(source, "compressed-tensors int8 W8A8 (integer activations) is not priced")
        return _int_scheme(bits, "compressed-tensors", source, weights.get("group_size"), not weights.get("symmetric", True))
    raise _refuse(
        source,
        f"compressed-tensors weights of {bits!r} bits, type {kind or 'unset'!r} (format {fmt or 'unset'!r}) are not understood",
    )


def _modelopt(quant: JSONObject, source: str) -> QuantScheme:
    nested = quant.get("quantization")  # hf_quant_config.json's layout
    nested_algo = nested.get("quant_algo") if isinstance(nested, dict) else None
    algo = str(quant.get("quant_algo") or nested_algo or "").upper()
    if algo == "NVFP4":
        return QuantScheme("nvfp4", "modelopt", 16)
    if algo == "FP8":
        return QuantScheme("fp8", "modelopt")
    raise _refuse(source, f"modelopt quant_algo {algo or 'unset'!r} is not understood (NVFP4 and FP8 are)")


def parse_quantization(quant: JSONValue, source: str) -> QuantScheme | None:
    """The scheme of a `quantization_config` section; None for an unquantized checkpoint."""
    if not quant:
        return None
    if not isinstance(quant, dict):
        raise _refuse(source, "config.json field 'quantization_config' must be an object")
    method = str(quant.get("quant_method", "")).strip().lower()
    if method == "fp8" or method == "compressed-tensors-fp8":
        return QuantScheme("fp8", method)
    if method == "mxfp4":
        return QuantScheme("mxfp4", method, 32, attention_quantized=False)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        zero_point = bool(quant.get("zero_point", True)) if method.startswith("awq") else not bool(quant.get("sym", True))
        return _int_scheme(
            quant.get("bits", quant.get("w_bit")), method, source, quant.get("group_size", quant.get("q_group_size")), zero_point
        )
    if method == "compressed-tensors":
        return _compressed_tensors(quant, source)
    if method == "modelopt":
        return _modelopt(quant, source)
    raise _refuse(
        source, f"quantization_config.quant_method '{method or 'unset'}' is not understood (known: {', '.join(KNOWN_METHODS)})"
    )
