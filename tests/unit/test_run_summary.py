"""The typed run summary: old files load and dump back unchanged; figures are read by name, never by path."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import vlmserve
from tests.helpers.paths import TESTS_ROOT
from tests.helpers.synthetic import saturating_records
from vlmserve.results.metrics import summarize
from vlmserve.results.summary import FIGURES, RunSummary, figure_value
from vlmserve.spec import SLO

RESULTS = TESTS_ROOT / "fixtures" / "results"
FIXTURE = RESULTS / "summary-0.1.json"
"""Written by vlmserve 0.1 (the dict summary): the figures and a minimal meta."""
OLD_FILES = ("summary-0.1.json", "summary-0.1-bench.json", "summary-0.1-plan.json")
"""0.1-format files written by the dict-building code before the blocks were typed: a `--repeat 2`
bench run with every block a bench run attaches (meta with engine traces, client CPU, server with
the engine breakdown, prefix cache, repeats), and a planner run with its simulation and frontend."""


@pytest.mark.parametrize("name", OLD_FILES)
def test_an_old_summary_file_round_trips_unchanged(name: str) -> None:
    text = (RESULTS / name).read_text()
    data = json.loads(text)
    summary = RunSummary.model_validate(data)
    assert summary.to_dict() == data
    if name != "summary-0.1.json":  # written by the producers (the first by hand: its meta keys in another order)
        assert json.dumps(summary.to_dict(), indent=2) + "\n" == text  # the same keys, in the same order
    assert summary.ttft_ms.p95 == data["ttft_ms"]["p95"]
    if data.get("goodput"):
        assert summary.goodput is not None
        assert summary.goodput.checks["ttft_p95"].met is data["goodput"]["checks"]["ttft_p95"]["met"]


def test_the_blocks_read_typed() -> None:
    bench = RunSummary.model_validate_json((RESULTS / "summary-0.1-bench.json").read_text())
    assert bench.meta.engine_traces is not None and bench.meta.engine_traces.records_matched == 12
    assert bench.client.cpu is not None and bench.client.cpu.worker_busy_fraction == {"0": 0.41}
    assert bench.server is not None and bench.server.engine_breakdown is not None
    assert bench.server.engine_breakdown.frontend_ms == 8.2
    assert bench.prefix_cache is not None and bench.prefix_cache.workload == "a pool of 4 prompts"
    assert bench.repeats is not None and bench.repeats.count == 2 and len(bench.repeats.runs) == 2
    assert bench.repeats.intervals is not None and bench.repeats.intervals["ttft_ms.p95"].low is not None
    plan = RunSummary.model_validate_json((RESULTS / "summary-0.1-plan.json").read_text())
    assert plan.simulated and plan.simulation is not None and plan.simulation.frontend is not None
    assert plan.simulation.frontend.mm_cache_hit_rate == 0.5


@pytest.mark.hostile("a summary file with a misspelled key in any block is refused, never kept as a silent extra")
@pytest.mark.parametrize(
    "where",
    [
        (),
        ("meta",),
        ("client",),
        ("client", "cpu"),
        ("server",),
        ("server", "engine_breakdown"),
        ("prefix_cache",),
        ("repeats",),
        ("repeats", "runs", 0),
        ("ttft_ms",),
        ("goodput", "checks", "ttft_p95"),
    ],
)
def test_a_misspelled_key_fails_instead_of_becoming_a_silent_extra(where: tuple[str | int, ...]) -> None:
    data = json.loads((RESULTS / "summary-0.1-bench.json").read_text())
    block = data
    for step in where:
        block = block[step]
    block["p95_ms" if where == ("ttft_ms",) else "misspeled"] = 1.0
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RunSummary.model_validate(data)


def test_a_producer_that_sets_a_misspelled_field_fails_where_it_writes() -> None:
    summary = summarize(saturating_records(2, requests=4), None)
    with pytest.raises(ValueError, match="run_idd"):
        summary.meta.run_idd = "r1"  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        summary.server = {"available": True, "prefix_cache_hitrate": 0.5}  # type: ignore[assignment]


@pytest.mark.hostile("runs/report: a stored run whose summary carries a key this version does not declare is one line")
def test_a_stored_run_that_does_not_read_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmserve.errors import UserError
    from vlmserve.results import store
    from vlmserve.results.run import RunResult

    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path))
    summary = summarize(saturating_records(2, requests=4), None)
    run_id = store.save_run(RunResult(records=[], summary=summary))
    with store._connect() as connection:
        connection.execute(
            "UPDATE runs SET summary = ? WHERE run_id = ?", [json.dumps({**summary.to_dict(), "futur_block": {}}), run_id]
        )
    with pytest.raises(UserError, match=r"does not read as a run summary \(futur_block: Extra inputs"):
        store.load_run(run_id)


def test_summarize_returns_the_typed_summary_with_the_documented_keys() -> None:
    summary = summarize(saturating_records(4, output_tokens=8, requests=12), SLO.parse("ttft_p95=500ms"))
    assert isinstance(summary, RunSummary)
    document = summary.to_dict()
    assert list(document)[:4] == ["requests", "duration_s", "throughput", "ttft_ms"]
    added_since = {"by_type"}  # per request type, added after 0.1
    assert set(json.loads(FIXTURE.read_text())) - {"meta", "warnings", "server", "prefix_cache"} == (set(document) - added_since)


def test_producers_blocks_are_written_even_when_filled_in_place() -> None:
    summary = summarize(saturating_records(2, requests=4), None)
    summary.meta.run_id = "r1"  # the store does this to the default block
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
            isinstance(node, ast.Attribute) and node.attr.endswith("summary")
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and named_summary(node.value):
            lines.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault")
            and named_summary(node.func.value)
        ):
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


def test_every_block_of_the_summary_forbids_unknown_keys() -> None:
    """Walk RunSummary's fields down to every nested model: each one is declared with extra="forbid"."""
    seen: set[type[BaseModel]] = set()

    def models_in(annotation: object) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        found: list[type[BaseModel]] = []
        for argument in typing.get_args(annotation):
            found += models_in(argument)
        return found

    pending: list[type[BaseModel]] = [RunSummary]
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        assert model.model_config.get("extra") == "forbid", model.__name__
        for info in model.model_fields.values():
            pending += models_in(info.annotation)
    names = {model.__name__ for model in seen}
    assert {
        "RunMeta",
        "ClientBlock",
        "ClientCpu",
        "ServerBlock",
        "EngineBreakdown",
        "PrefixCacheBlock",
        "RepeatsBlock",
        "RepeatRow",
        "ConfidenceInterval",
        "SimulationBlock",
        "SimulatedFrontend",
        "ScalingBlock",
        "ScalingWindow",
        "ScaleUp",
        "ScaleDown",
        "EngineTraces",
        "Distribution",
        "Goodput",
        "SloCheck",
        "TypeSummary",
        "TtftBreakdown",
        "FeatureSummary",
        "AdapterSummary",
    } <= names
