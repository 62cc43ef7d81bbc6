"""Parsing helpers for flags shared by several verbs, so each mistake reads the same everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlmserve.bounded_read import CONFIG_FILE, Refused, loads_json, read_bytes
from vlmserve.errors import UserError


def parse_json_object_flag(flag: str, text: str | None) -> dict[str, Any] | None:
    """A flag whose value is a JSON object, given inline or as `@path/to/file.json`.

    None stays None (flag not given); anything else that is not a JSON object is one clear line.
    """
    if text is None:
        return None
    candidate = Path(text[1:]) if text.startswith("@") else None
    try:
        raw = read_bytes(candidate, CONFIG_FILE) if candidate is not None and candidate.is_file() else text
        value = loads_json(raw, CONFIG_FILE)
    except OSError as err:
        raise UserError(f"{flag}: cannot read {candidate} ({err.strerror or type(err).__name__})") from None
    except Refused as err:
        raise UserError(f"{flag}: {candidate or 'the value'} {err}") from None
    except UnicodeDecodeError:
        raise UserError(f"{flag}: {candidate} is not UTF-8 text; give a JSON file") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{flag}: not valid JSON ({err.msg} at character {err.pos}); write it like '{{\"key\": 1}}'") from None
    if not isinstance(value, dict):
        raise UserError(f"{flag}: give a JSON object, like '{{\"key\": 1}}'")
    return value
