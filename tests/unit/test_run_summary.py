"""The typed run summary: old files load and dump back unchanged; figures are read by name, never by path."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import vlmserve
from tests.helpers.synthetic import saturating_records
from vlmserve.results.metrics import summarize
from vlmserve.results.summary import FIGURES, RunSummary, figure_value
from vlmserve.spec import SLO
from tests.helpers.paths import TESTS_ROOT

FIXTURE = TESTS_ROOT / "fixtures" / "results" / "summary-0.1.json"
"""Written by vlmserve 0.1 (the dict summary), with an unknown block a newer version might add."""


def test_an_old_summary_file_round_trips_unchanged() -> None:
    data = json.loads(FIXTURE.read_text())
    summary = RunSummary.model_validate(data)
    assert summary.to_dict() == data
    assert summary.ttft_ms.p95 == data["ttft_ms"]["p95"]
    assert summary.goodput is not None and summary.goodput.checks["ttft_p95"].met is data["goodput"]["checks"]["ttft_p95"]["met"]


def test_summarize_returns_the_typed_summary_with_the_documented_keys() -> None:
    summary = summarize(saturating_records(4, output_tokens=8, requests=12), SLO.parse("ttft_p95=500ms"))
    assert isinstance(summary, RunSummary)
    document = summary.to_dict()
    assert list(document)[:4] == ["requests", "duration_s", "throughput", "ttft_ms"]
    added_since = {"by_type"}  # per request type, added after 0.1
    assert set(json.loads(FIXTURE.read_text())) - {"meta", "warnings", "server", "prefix_cache", "future_block"} == (
        set(document) - added_since)


def test_producers_blocks_are_written_even_when_filled_in_place() -> None:
    summary = summarize(saturating_records(2, requests=4), None)
    summary.meta["run_id"] = "r1"  # the store does this to the default dict
    assert summary.to_dict()["meta"] == {"run_id": "r1"}
    assert list(summary.to_dict())[0] == "meta"


def test_every_figure_reads_a_number_or_none() -> None:
    summary = summarize(saturating_records(4, requests=8), SLO.parse("ttft_p95=1s"))
    for name in FIGURES:
        value = figure_value(summary, name)
        assert value is None or isinstance(value, float), name
    assert figure_value(summary, "ttft_ms.p95") == summary.ttft_ms.p95
    assert figure_value(None, "ttft_ms.p95") is None
    with pytest.raises(KeyError, match="unknown figure"):
        figure_value(summary, "ttft.p95")


def _summary_reads(tree: ast.AST) -> list[int]:
    """Lines that index or .get() something named *summary: the untyped reads the model replaced."""
    def named_summary(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id.endswith("summary")) or (
            isinstance(node, ast.Attribute) and node.attr.endswith("summary"))

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and named_summary(node.value):
            lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault")
                and named_summary(node.func.value)):
            lines.append(node.lineno)
    return lines


def test_no_module_reads_run_figures_by_string_path() -> None:
    """No dict walking over summaries: no `summary[...]`/`summary.get(...)`, no dotted-path splitting."""
    offenders = []
    for path in Path(vlmserve.__file__).parent.rglob("*.py"):
        source = path.read_text()
        tree = ast.parse(source)
        offenders += [f"{path.name}:{line}" for line in _summary_reads(tree)]
        if 'split(".")' in source:
            offenders.append(f"{path.name}: splits a dotted path")
    assert not offenders, offenders
