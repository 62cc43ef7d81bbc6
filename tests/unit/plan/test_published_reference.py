"""The published reference (benchmarks/data/published_vllm.csv) and how plan_vs_published.py uses it.

The held-out figures docs/plan.md quotes are honest only while: every source sits wholly on one
side of the split, the split is the written hash rule (no source moved by hand), the fit sees
calibration runs only, and a run the planner cannot price is reported, not dropped.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from vlmserve.errors import UserError

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "benchmarks/data/published_vllm.csv"
SHARED_IDS = {
    "spark-oss-c1",
    "spark-oss-c4",
    "spark-oss-c16",
    "spark-oss-c64",
    "h100-oss-tp1",
    "h100-oss-tp2",
    "h100-oss-tp4",
    "h100-qwen3-8b-c4",
    "h100-llama3-8b",
    "l4x4-qwen3-4b",
}


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    yield importlib.import_module("plan_vs_published")


def _rows() -> list[dict[str, str]]:
    with REFERENCE.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_every_source_is_wholly_on_one_side_and_the_split_is_the_written_hash_rule() -> None:
    rows = _rows()
    side: dict[str, set[str]] = {}
    gpu_of: dict[str, set[str]] = {}
    for row in rows:
        side.setdefault(row["source"], set()).add(row["split"])
        gpu_of.setdefault(row["source"], set()).add(row["gpu"])
    assert all(len(sides) == 1 for sides in side.values()), {s: v for s, v in side.items() if len(v) > 1}
    # The rule in benchmarks/data/README.md: per GPU, sources by SHA-256 of their key, the first ⌈0.4·n⌉ calibrate.
    groups: dict[str, list[str]] = {}
    for source, gpus in gpu_of.items():
        groups.setdefault(sorted(gpus)[0], []).append(source)
    for sources in groups.values():
        ordered = sorted(sources, key=lambda key: hashlib.sha256(key.encode()).hexdigest())
        calibrating = math.ceil(0.4 * len(ordered)) if len(ordered) >= 2 else 0
        for index, source in enumerate(ordered):
            assert side[source] == {"calibration" if index < calibrating else "validation"}, source
    calibration = sum(1 for sides in side.values() if sides == {"calibration"})
    assert len(side) / 3 <= calibration <= len(side) / 2


def test_the_reference_keeps_the_shared_rows_and_adds_at_least_25_cited_runs() -> None:
    rows = _rows()
    ids = {row["id"] for row in rows}
    assert SHARED_IDS <= ids
    new = {row["id"] for row in rows if row["id"] not in SHARED_IDS}
    assert len(new) >= 25
    for row in rows:
        assert float(row["value"]) > 0, row["id"]
        if row["id"] in new:  # every new figure names where it was published
            assert row["citation_url"].startswith("https://") and row["citation_where"], row["id"]
    assert {"H100 SXM", "H200 SXM", "A100 80GB SXM", "B200"} <= {row["gpu"] for row in rows}


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _run_row(run_id: str, source: str, split: str, **overrides: str) -> dict[str, str]:
    row = {
        "id": run_id,
        "source": source,
        "split": split,
        "model": "Qwen/Qwen3-8B",
        "planner_model": "Qwen/Qwen3-8B",
        "gpu": "H100 SXM",
        "gpus": "1",
        "tp": "1",
        "expert_parallel": "no",
        "weight_dtype": "bf16",
        "kv_dtype": "auto (bf16)",
        "dataset": "random",
        "input_len": "256",
        "output_len": "16",
        "num_prompts": "8",
        "max_concurrency": "2",
        "request_rate": "inf",
        "vllm_version": "",
        "flags": "",
        "metric": "mean_tpot_ms",
        "value": "8.0",
        "unit": "ms",
        "citation_url": "https://example.org",
        "citation_where": "table 1",
        "assumed": "",
    }
    row.update(overrides)
    return row


def test_a_source_on_both_sides_is_refused_in_one_line(published: ModuleType, tmp_path: Path) -> None:
    path = _write(tmp_path / "ref.csv", [_run_row("a", "blog", "calibration"), _run_row("b", "blog", "validation")])
    with pytest.raises(UserError, match=r"ref.csv:3: source 'blog' is on both sides of the split"):
        published.read_runs(path)


def test_a_split_that_is_neither_side_is_refused(published: ModuleType, tmp_path: Path) -> None:
    path = _write(tmp_path / "ref.csv", [_run_row("a", "blog", "held-out")])
    with pytest.raises(UserError, match="split must be 'calibration' or 'validation'"):
        published.read_runs(path)


def test_runs_the_planner_cannot_price_are_refused_with_its_reason_not_dropped(published: ModuleType, tmp_path: Path) -> None:
    path = _write(
        tmp_path / "ref.csv",
        [
            _run_row("ok", "a", "validation"),
            _run_row("gpu", "b", "validation", gpu="Imaginary X1 (12 GB)"),
            _run_row("model", "c", "validation", planner_model="nobody/no-such-model"),
            _run_row("spec", "d", "validation", flags="--speculative-config {}"),
            _run_row("metric", "e", "validation", metric="tokens_per_joule"),
        ],
    )
    runs = published.read_runs(path)
    cases, refused = published.build_cases(runs, 1.0)
    assert [case.run.run_id for case in cases] == ["ok"]
    assert set(refused) == {"gpu", "model", "spec", "metric"}
    assert "unknown GPU 'Imaginary X1'" in refused["gpu"]
    assert "unknown model 'nobody/no-such-model'" in refused["model"]
    assert "speculative decoding" in refused["spec"]
    assert "tokens_per_joule" in refused["metric"]


def test_the_fit_sees_calibration_runs_only_and_the_held_out_table_validation_runs_only(
    published: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(
        tmp_path / "ref.csv",
        [
            _run_row("cal-c1", "cal", "calibration", max_concurrency="1"),
            _run_row("cal-c2", "cal", "calibration"),
            _run_row("val-c2", "val", "validation", value="10.0"),
        ],
    )
    cases, refused = published.build_cases(published.read_runs(path), 1.0)
    assert not refused
    seen: list[str] = []
    real_fit = published.fit

    def recording_fit(scenarios, start, parameters, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend(scenario.scenario_id for scenario in scenarios)
        return real_fit(scenarios, start, parameters, max_evaluations=4)

    monkeypatch.setattr(published, "fit", recording_fit)
    calibration, notes = published.refit(cases, lambda _line: None)
    assert seen and set(seen) <= {"cal-c1", "cal-c2"}
    assert "calibration sources" in calibration.source and notes

    predictions = {case.scenario.scenario_id: {"mean_tpot_ms": 12.0} for case in cases}
    rows = published.errors_of(cases, predictions)
    held_out = [row for row in rows if row.case.run.split == published.VALIDATION]
    table = "\n".join(published.summary_table(held_out, "held-out", with_targets=True))
    assert "| tpot/itl | 1 | 1 | 1 | **20.0%** | 20.0% | ≤ 15%: MISSED |" in table  # 12 against 10, the validation run only


def test_each_overhead_stage_fits_on_the_runs_where_its_cost_shows(published: ModuleType, tmp_path: Path) -> None:
    """Engine overheads on few-stream closed loops; the API server on all-at-once bursts; neither sees the other's runs."""
    path = _write(
        tmp_path / "ref.csv",
        [
            _run_row("few", "cal", "calibration", max_concurrency="4", num_prompts="40"),
            _run_row("burst", "cal", "calibration", max_concurrency="", num_prompts="100"),
            _run_row("mid", "cal", "calibration", max_concurrency="64", num_prompts="128"),
        ],
    )
    cases, _ = published.build_cases(published.read_runs(path), 1.0)
    stages = {stage.title: {case.run.run_id for case in cases if stage.selects(case)} for stage in published.fit_stages(cases)}
    assert stages["engine overheads at low concurrency on the reference GPU"] == {"few"}
    assert stages["API server under bursts on the reference GPU"] == {"burst"}


def test_a_vllm_bench_run_with_max_concurrency_starts_its_first_wave_together(published: ModuleType, tmp_path: Path) -> None:
    """`vllm bench serve` sends every prompt at once through a semaphore of --max-concurrency: no staggered start."""
    path = _write(tmp_path / "ref.csv", [_run_row("c4", "cal", "calibration", max_concurrency="4", num_prompts="40")])
    (case,), _ = published.build_cases(published.read_runs(path), 1.0)
    assert case.scenario.load.concurrency == 4 and case.scenario.load.num_requests == 40
    assert case.scenario.staggered is False
    assert published.LEGACY_WORKLOADS["spark-oss-c4"].staggered is True  # other tools keep their recorded assumption
