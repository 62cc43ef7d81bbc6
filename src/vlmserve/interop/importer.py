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

from vlmserve.bounded_read import RESULT_FILE, Refused, loads_json, printable, read_bytes
from vlmserve.errors import UserError
from vlmserve.interop import aiperf, guidellm, inference_perf, vllm_bench, vlmserve_json
from vlmserve.json_types import JSONObject, JSONValue
from vlmserve.results.blocks import RunMeta
from vlmserve.results.run import RunResult

Reader = Callable[[JSONObject, Path], "RunResult | list[RunResult]"]

FORMATS: tuple[tuple[str, Callable[[JSONValue], bool], Reader], ...] = (
    (vlmserve_json.TOOL, vlmserve_json.looks_like_vlmserve_summary, lambda data, _: vlmserve_json.from_vlmserve_summary(data)),
    (vllm_bench.TOOL, vllm_bench.looks_like_vllm_result, lambda data, _: vllm_bench.from_vllm_result(data)),
    (aiperf.TOOL, aiperf.looks_like_aiperf, lambda data, _: aiperf.from_aiperf(data)),
    (guidellm.TOOL, guidellm.looks_like_guidellm, lambda data, _: guidellm.from_guidellm(data)),
    (inference_perf.TOOL, inference_perf.looks_like_inference_perf, inference_perf.from_inference_perf),
)
"""(tool, recogniser, reader) for every format `runs import` reads; a reader gets the file's path
too (inference-perf reads the config.yaml beside its report)."""

EXPECTED = (
    "a result file of vlmserve (bench --json-out), vllm bench serve (--save-result), AIPerf "
    "(profile_export_aiperf.json), guidellm (benchmarks JSON) or inference-perf "
    "(summary_lifecycle_metrics.json)"
)

GENERIC_NAMES = frozenset({"profile_export_aiperf", "benchmarks", "summary_lifecycle_metrics", "result", "results"})
"""File names a tool always writes: the default label adds the folder, so two runs' labels differ."""


def read_result_runs(path: Path, label: str | None = None) -> list[RunResult]:
    """Every run the file holds (guidellm: one per benchmark), each marked with its tool and labelled;
    a one-line UserError when the file is none we read."""
    try:
        data = loads_json(read_bytes(path, RESULT_FILE), RESULT_FILE)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give {EXPECTED}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read it ({type(err).__name__}); give {EXPECTED}") from None
    except Refused as err:
        raise UserError(
            f"{path}: {err}; give {EXPECTED} within that bound (a detailed file of a "
            "very long run: save it without --save-detailed)"
        ) from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not JSON (line {err.lineno}: {err.msg}); give {EXPECTED}") from None
    for tool, recognises, reader in FORMATS:
        if recognises(data):
            try:
                read = reader(data, path)
            except UserError as err:
                raise UserError(f"{path}: {err.message}") from None
            except (TypeError, ValueError, KeyError, AttributeError, IndexError) as err:
                raise UserError(
                    f"{path} looks like {tool} output but a field is malformed "
                    f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                    f"re-create it with {tool}"
                ) from None
            results = read if isinstance(read, list) else [read]
            for result in results:
                _describe(result, path, tool, label, several=len(results) > 1)
            return results
    raise UserError(f"{path} is JSON but not a result file vlmserve reads; give {EXPECTED}")


def read_result_file(path: Path, label: str | None = None) -> RunResult:
    """The file's first (usually only) run."""
    return read_result_runs(path, label)[0]


def default_label(path: Path, tool: str) -> str:
    """'aiperf: run-a/profile_export_aiperf' for a name the tool always writes, else 'tool: stem'."""
    stem = path.stem
    if stem in GENERIC_NAMES and path.resolve().parent.name:
        stem = f"{path.resolve().parent.name}/{stem}"
    return f"{tool}: {stem}"


def _describe(result: RunResult, path: Path, tool: str, label: str | None, several: bool) -> None:
    """Label (given, the file's own, or from the file name), tool, origin; several runs of one file
    get their strategy appended so they stay apart."""
    meta = result.meta
    meta.imported_from = str(path.resolve())
    chosen = label or meta.label or default_label(path, tool)
    if several and meta.strategy:
        chosen = f"{chosen} {meta.strategy}"
    meta.label = chosen
    meta.tool = meta.tool or tool
    _make_printable(meta)


PRINTED_META: tuple[str, ...] = ("label", "model", "target", "started_at", "imported_from", "tool_version", "strategy")
"""The meta fields (all text) that `runs list`, `report` and `compare` print."""


def _make_printable(meta: RunMeta) -> None:
    """The file's words (label, model, target, dates) are printed by `runs list`, `report` and
    `compare`: escape sequences and other control characters in them are shown, not obeyed."""
    for key in PRINTED_META:
        value = getattr(meta, key)
        if value is not None:
            setattr(meta, key, printable(str(value)))


def import_result_file(path: Path, label: str | None = None, *, simulated: bool = False) -> list[tuple[str, RunResult]]:
    """Read and store every run of the file; returns (run id, result) for each.

    `simulated` marks runs the user knows ran against a sim engine (`--simulated`): only
    vlmserve's own files say so themselves, and a simulated figure must never pass as measured.
    """
    from vlmserve.results import store

    results = read_result_runs(path, label)
    for result in results:
        result.meta.simulated = result.meta.simulated or simulated
    return [(store.save_run(result), result) for result in results]
