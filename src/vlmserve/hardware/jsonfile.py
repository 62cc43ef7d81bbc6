"""Reading the JSON files users hand the planner (config.json, calibrations, bench results)."""

from __future__ import annotations

import json
from pathlib import Path

from vlmserve.bounded_read import RESULT_FILE, Limits, Refused, loads_json, read_bytes
from vlmserve.errors import UserError
from vlmserve.json_types import JSONValue


def read_json_file(path: str | Path, what: str, hint: str, limits: Limits = RESULT_FILE) -> JSONValue:
    """Parsed JSON, or a one-line UserError naming the file, what it should be and what to do.

    The file is bounded by `limits` (size, nesting, values, numbers) before it is parsed."""
    file_path = Path(path)
    if not file_path.is_file():
        raise UserError(f"{file_path}: no such {what}; {hint}")
    try:
        return loads_json(read_bytes(file_path, limits), limits)
    except OSError as err:
        raise UserError(f"{file_path}: cannot read it ({err.strerror or type(err).__name__}); {hint}") from None
    except Refused as err:
        raise UserError(f"{file_path}: {err}; {hint}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{file_path}: not valid JSON (line {err.lineno}); {hint}") from None
    except UnicodeDecodeError:
        raise UserError(f"{file_path}: not valid JSON (not UTF-8 text); {hint}") from None
