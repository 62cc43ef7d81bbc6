"""Reading other tools' JSON defensively: a field of the wrong type is absent, never a crash.

Another tool's file may lack a block, or hold a string where a number belongs (a newer or
older version, a hand edit); the readers take what is there and leave the rest unknown.
"""

from __future__ import annotations

from vlmserve.json_types import JSONObject, JSONValue


def mapping(parent: JSONValue, key: str) -> JSONObject:
    """parent[key] when both are JSON objects, else {}."""
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}


def objects(parent: JSONObject, key: str) -> list[JSONObject]:
    """The JSON objects in the list parent[key]; [] when it is not a list (other items skipped)."""
    value = parent.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def count(value: JSONValue) -> int:
    """A request count: absent or null is 0; anything that is not a number raises (the file is
    malformed, and the import says so in one line rather than guessing)."""
    if isinstance(value, (list, dict)):
        raise TypeError(f"a count must be a number, not a JSON {type(value).__name__}")
    return int(value or 0)


def number(value: JSONValue) -> float | None:
    """A JSON number as a float; None for anything else (booleans included)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def broken_run_warning(what: str, completed: int, failed: int, more: list[str] | None = None) -> list[str]:
    """One line when the file is from a broken run (failed requests, none completed, `more` reasons), else [].

    `what` names the file ('this AIPerf file'); its figures cover only the requests that succeeded,
    which a reader comparing it with a clean run must know.
    """
    reasons = [f"{failed} of {completed + failed} requests failed"] if failed else []
    if not completed:
        reasons.append("no request completed")
    reasons += more or []
    if not reasons:
        return []
    return [f"{what} is from a broken run ({'; '.join(reasons)}): its figures cover only the requests that succeeded"]
