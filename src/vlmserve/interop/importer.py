"""`vlmserve runs import FILE`: another tool's result file into the run history.

The file's format is recognised by its keys (never by its name), turned into a RunResult
marked `meta.tool` with the tool that made it, and stored like a bench run, so `runs list`,
`report` and `compare` show it beside vlmserve's runs. Anything else (not JSON, another
tool's JSON, a damaged file) is refused with one line saying what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmserve.results.run import RunResult
from vlmserve.errors import UserError
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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give the result file `vllm bench serve --save-result` wrote") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read it ({type(err).__name__}); give {EXPECTED}") from None
    try:
        data = json.loads(text)
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
            return result
    raise UserError(f"{path} is JSON but not a result file vlmserve reads; give {EXPECTED}")


def import_result_file(path: Path) -> tuple[str, RunResult]:
    """Read and store the file; returns (run id, result)."""
    from vlmserve.results import store

    result = read_result_file(path)
    return store.save_run(result), result
