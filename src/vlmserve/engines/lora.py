"""A spec's LoRA adapters, checked on this machine before any engine starts, and their vLLM flags.

vLLM refuses a bad adapter only after a minute of engine start (or, for a rank above
`--max-lora-rank`, on the first request that uses it). `up` reads each adapter's
adapter_config.json first, so a missing directory, a file that is not a PEFT LoRA adapter or a
rank the spec's slots cannot hold is one line naming the adapter, before anything is started.
"""

from __future__ import annotations

from pathlib import Path

from vlmserve.bounded_read import CONFIG_FILE, Refused, loads_json, printable, read_bytes
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.spec import LoraOptions
from vlmserve.vllm_flags import VLLM_DEFAULT_MAX_LORA_RANK

ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
"""The weight files a PEFT adapter directory holds (vLLM reads either)."""


def resolved_adapters(lora: LoraOptions) -> dict[str, str]:
    """name -> absolute directory, each checked (embedded:N made on first use); UserError names the first bad one."""
    from vlmserve.engines.embedded_adapters import resolve_adapter_path

    max_rank = lora.max_lora_rank or VLLM_DEFAULT_MAX_LORA_RANK
    resolved: dict[str, str] = {}
    for name, value in lora.lora_modules.items():
        where = f"lora_modules.{name}"
        path = resolve_adapter_path(value)
        rank = adapter_rank(path, where)
        if rank > max_rank:
            wanted = "max_lora_rank" if lora.max_lora_rank else f"max_lora_rank (vLLM's default is {max_rank})"
            raise UserError(f"{where}: rank {rank} is above {wanted}; set max_lora_rank to at least {rank}")
        resolved[name] = str(path)
    return resolved


def adapter_rank(path: Path, where: str) -> int:
    """The rank `r` of the PEFT LoRA adapter at `path`, or UserError saying what is wrong with it."""
    shown = printable(str(path))
    if not path.exists():
        raise UserError(f"{where}: {shown} does not exist; give the adapter's PEFT directory")
    if not path.is_dir():
        raise UserError(f"{where}: {shown} is not a directory; give the adapter's PEFT directory")
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise UserError(f"{where}: {shown} has no adapter_config.json; is it a PEFT LoRA adapter?")
    if not any((path / name).is_file() for name in ADAPTER_WEIGHT_FILES):
        raise UserError(f"{where}: {shown} has no {' or '.join(ADAPTER_WEIGHT_FILES)}; the adapter's weights are missing")
    config = _read_config(config_file, where)
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise UserError(f"{where}: a {printable(str(peft_type), 40)} adapter; vLLM serves LoRA adapters only")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise UserError(f"{where}: adapter_config.json has no positive integer 'r' (the adapter's rank)")
    return rank


def _read_config(config_file: Path, where: str) -> JSONObject:
    try:
        config = loads_json(read_bytes(config_file, CONFIG_FILE), CONFIG_FILE)
    except OSError as err:
        raise UserError(f"{where}: cannot read adapter_config.json ({err.strerror or type(err).__name__})") from None
    except Refused as err:
        raise UserError(f"{where}: adapter_config.json: {err}") from None
    except ValueError:
        raise UserError(f"{where}: adapter_config.json is not valid JSON") from None
    if not isinstance(config, dict):
        raise UserError(f"{where}: adapter_config.json is not a JSON object")
    return config


def lora_argv(lora: LoraOptions) -> list[str]:
    """vLLM's LoRA flags for the spec (names as vLLM's); nothing when LoRA is off."""
    if not lora.lora_enabled:
        return []
    argv = ["--enable-lora"]
    if lora.lora_modules:
        argv += ["--lora-modules", *(f"{name}={path}" for name, path in lora.lora_modules.items())]
    for flag, value in (
        ("--max-loras", lora.max_loras),
        ("--max-lora-rank", lora.max_lora_rank),
        ("--max-cpu-loras", lora.max_cpu_loras),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv
