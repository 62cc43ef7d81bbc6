"""Reading the JSON files users hand the planner (config.json, calibrations, bench results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlmserve.errors import UserError


def read_json_file(path: str | Path, what: str, hint: str) -> Any:
    """Parsed JSON, or a one-line UserError naming the file, what it should be and what to do."""
    file_path = Path(path)
    if not file_path.is_file():
        raise UserError(f"{file_path}: no such {what}; {hint}")
    try:
        return json.loads(file_path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{file_path}: not valid JSON (line {err.lineno}); {hint}") from None
