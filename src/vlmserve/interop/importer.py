"""`vlmserve runs import FILE`: another tool's result file into the run history.

The file's format is recognised by its keys (never by its name), turned into a RunResult
marked `meta.tool` with the tool that made it, and stored like a bench run, so `runs list`,
`report` and `compare` show it beside vlmserve's runs. Anything else (not JSON, another
tool's JSON, a damaged file, one over the result-file bounds of `bounded_read`: size,
nesting, values, integer digits, non-finite numbers) is refused with one line saying what
was expected.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmserve.bounded_read import RESULT_FILE, Refused, loads_json, printable, read_bytes
from vlmserve.errors import UserError
from vlmserve.results.run import RunResult
from vlmserve.interop import aiperf, vllm_bench

FORMATS: tuple[tuple[str, Callable[[Any], bool], Callable[[dict[str, Any]], RunResult]], ...] = (
    (vllm_bench.TOOL, vllm_bench.looks_like_vllm_result, vllm_bench.from_vllm_result),
    (aiperf.TOOL, aiperf.looks_like_aiperf, aiperf.from_aiperf),
)
"""(tool, recogniser, reader) for every format `runs import` reads."""

EXPECTED = ("a `vllm bench serve --save-result` JSON file or an AIPerf profile_export_aiperf.json "
            "(guidellm's benchmarks JSON is not read yet)")


def read_result_file(path: Path) -> RunResult:
    """The file as a RunResult marked with its tool; a one-line UserError when it is none we read."""
    try:
        data = loads_json(read_bytes(path, RESULT_FILE), RESULT_FILE)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give the result file `vllm bench serve --save-result` wrote") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read it ({type(err).__name__}); give {EXPECTED}") from None
    except Refused as err:
        raise UserError(f"{path}: {err}; give {EXPECTED} within that bound (a detailed file of a "
                        "very long run: save it without --save-detailed)") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not JSON (line {err.lineno}: {err.msg}); give {EXPECTED}") from None
    for tool, recognises, reader in FORMATS:
        if recognises(data):
            try:
                result = reader(data)
            except UserError:
                raise
            except (TypeError, ValueError, KeyError, AttributeError) as err:
                raise UserError(f"{path} looks like {tool} output but a field is malformed "
                                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                                f"re-create it with {tool}") from None
            result.meta["imported_from"] = str(path.resolve())
            result.meta.setdefault("label", None)
            if not result.meta["label"]:
                result.meta["label"] = f"{tool}: {path.stem}"
            _make_printable(result.meta)
            return result
    raise UserError(f"{path} is JSON but not a result file vlmserve reads; give {EXPECTED}")


def _make_printable(meta: dict[str, Any]) -> None:
    """The file's words (label, model, target, dates) are printed by `runs list`, `report` and
    `compare`: escape sequences and other control characters in them are shown, not obeyed."""
    for key in ("label", "model", "target", "started_at", "imported_from"):
        value = meta.get(key)
        if value is not None:
            meta[key] = printable(str(value))


def import_result_file(path: Path) -> tuple[str, RunResult]:
    """Read and store the file; returns (run id, result)."""
    from vlmserve.results import store

    result = read_result_file(path)
    return store.save_run(result), result
