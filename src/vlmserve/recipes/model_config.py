"""Find and read a model's config.json: a local directory, or a hub id already in the HF cache.

Recipes are chosen before anything starts, so nothing is downloaded: a hub id whose config.json is
not cached simply has no recipe yet (the caller says so). A directory holding only config.json is
enough (a recipe needs the family, not the weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmserve.errors import UserError


@dataclass(frozen=True)
class FoundConfig:
    """A model's config.json, or why there is none (`config` None)."""

    config: dict[str, Any] | None
    where: str  # the file read, or why nothing was


def looks_like_directory(model: str) -> bool:
    """'/x', './x', '~/x', 'x/' or an existing path name a directory; 'org/name' is a hub id."""
    return model.startswith(("/", "./", "../", "~")) or model.endswith("/") or Path(model).exists()


def read_config_file(path: Path) -> dict[str, Any]:
    """config.json as a mapping; anything unreadable is one line naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or type(err).__name__}); "
                        "check the file's permissions") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; config.json is a JSON file") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}); fix the file") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: config.json must be a JSON object (model_type, architectures, ...)")
    return value


def find_model_config(model: str) -> FoundConfig:
    """The config.json for `model` (a directory or a hub id); a bad local path is a UserError."""
    if looks_like_directory(model):
        directory = Path(model).expanduser()
        if not directory.exists():
            raise UserError(f"{directory}: no such directory; give a model directory or a hub id like org/name")
        if not directory.is_dir():
            raise UserError(f"{directory}: not a directory; give the model directory that holds config.json")
        config_file = directory / "config.json"
        if not config_file.is_file():
            raise UserError(f"{directory}: no config.json here; give a Hugging Face model directory")
        return FoundConfig(read_config_file(config_file), str(config_file))
    cached = _hub_cached_config(model)
    if cached is None:
        return FoundConfig(None, f"{model}: no local directory, and its config.json is not in the Hugging Face "
                                 f"cache (fetch it once: `hf download {model} config.json`, or give the directory)")
    return FoundConfig(read_config_file(cached), str(cached))


def _hub_cached_config(model_id: str) -> Path | None:
    """config.json of a hub model already in the local cache (None: not cached, or no hub library)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # no hub library or a malformed id: no recipe, said by the caller
        return None
    return Path(cached) if isinstance(cached, str) else None
