"""Find and read a model's config.json: a local directory, or a hub id already in the HF cache.

A hub id's config.json is read from the Hugging Face cache, else fetched once (a few kB, one try,
5 s at most; vLLM would fetch it moments later anyway), so the first `up` of a hub model gets the same recipe as the second. With
HF_HUB_OFFLINE set nothing is fetched and an uncached id has no recipe (the caller says so). A
directory holding only config.json is enough (a recipe needs the family, not the weights).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vlmserve.bounded_read import CONFIG_FILE, Refused, loads_json, read_bytes
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject


@dataclass(frozen=True)
class FoundConfig:
    """A model's config.json, or why there is none (`config` None)."""

    config: JSONObject | None
    where: str  # the file read, or why nothing was


def looks_like_directory(model: str) -> bool:
    """'/x', './x', '~/x', 'x/' or an existing path name a directory; 'org/name' is a hub id."""
    return model.startswith(("/", "./", "../", "~")) or model.endswith("/") or Path(model).exists()


def read_config_file(path: Path) -> JSONObject:
    """config.json as a mapping; anything unreadable, or over the config-file bounds (size,
    nesting, values: `bounded_read.CONFIG_FILE`), is one line naming the file."""
    try:
        value = loads_json(read_bytes(path, CONFIG_FILE).decode("utf-8"), CONFIG_FILE)
    except Refused as err:
        raise UserError(f"{path}: {err}; a config.json is a flat JSON object of a few kB, fix the file") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or type(err).__name__}); check the file's permissions") from None
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
        fetched, where = _hub_fetch_config(model)
        if fetched is None:
            return FoundConfig(
                None,
                f"{model}: no local directory, and its config.json is not in the Hugging Face "
                f"cache ({where}; fetch it with `hf download {model} config.json` "
                "or give the directory)",
            )
        return FoundConfig(fetched, where)
    return FoundConfig(read_config_file(cached), str(cached))


def _hub_cached_config(model_id: str) -> Path | None:
    """config.json of a hub model already in the local cache (None: not cached, or no hub library)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # no hub library or a malformed id: no recipe, said by the caller
        return None
    return Path(cached) if isinstance(cached, str) else None


HUB_FETCH_TIMEOUT_S = 5.0
"""One try, this long: a machine without the hub must not wait on retries to start."""


def _hub_fetch_config(model_id: str) -> tuple[JSONObject | None, str]:
    """A hub model's config.json fetched once, in memory: (config, url) or (None, why not, one line).

    Plain HTTP with a short timeout rather than huggingface_hub's download, which retries five
    times with back-off (24 s here without a network) and logs each try."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return None, "HF_HUB_OFFLINE is set"
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model_id):
        return None, "not a hub id like org/name"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if not endpoint.startswith(("https://", "http://")):  # urllib would open file: and other schemes too
        return None, f"HF_ENDPOINT {endpoint[:80]!r} is not an http(s) URL"
    url = f"{endpoint}/{model_id}/resolve/main/config.json"
    token = os.environ.get("HF_TOKEN") or _stored_token()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=HUB_FETCH_TIMEOUT_S) as response:  # noqa: S310 - http(s) checked above
            value = loads_json(response.read(CONFIG_FILE.max_bytes + 1), CONFIG_FILE)  # Refused is a ValueError
    except urllib.error.HTTPError as err:
        return None, f"fetching it failed: HTTP {err.code}{' (gated? set HF_TOKEN)' if err.code in (401, 403) else ''}"
    except (OSError, ValueError) as err:  # no network, a timeout, not JSON
        reason = getattr(err, "reason", None) or err
        return None, f"fetching it failed: {str(reason).splitlines()[0][:160] if str(reason) else type(err).__name__}"
    if not isinstance(value, dict):
        return None, "fetching it failed: not a JSON object"
    return value, url


def _stored_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # no hub library: no stored token
        return None
