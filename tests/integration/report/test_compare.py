"""`vlmserve compare` on two stored runs: ratios printed, an injected regression flagged, exit code for CI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.synthetic import saturating_records
from vlmserve.errors import UserError
from vlmserve.report.compare import compare
from vlmserve.report.source import load_source
from vlmserve.results.metrics import summarize
from vlmserve.results.run import RunResult


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stored_run(label: str, slowdown: float, input_len: int = 128) -> str:
    from vlmserve.results import store

    records = saturating_records(4, slowdown=slowdown)
    summary = summarize(records, None)
    summary.meta = {
        "label": label,
        "target": "http://127.0.0.1:1",
        "model": "m",
        "load_spec": {"dataset": "random", "input_len": input_len, "output_len": 32, "concurrency": 4},
    }
    return store.save_run(RunResult(records=records, summary=summary))


def run_cli(vlmserve_cmd: list[str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLMSERVE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*vlmserve_cmd, *args], capture_output=True, text=True, timeout=120, env=env)


def test_compare_prints_ratios_and_flags_regression(home: Path, vlmserve_cmd: list[str]) -> None:
    baseline = stored_run("baseline", slowdown=5.6)
    faster = stored_run("candidate", slowdown=1.0)
    done = run_cli(vlmserve_cmd, home, "compare", baseline, faster, "--fail-on-regression")
    assert done.returncode == 0, done.stderr
    assert "TTFT p50 5.6× lower" in done.stdout
    assert "throughput 5.6× higher" in done.stdout
    assert "no regression beyond the 10% noise threshold" in done.stdout
    assert "the loads differ" not in done.stdout

    # injected regression: the candidate is 30% slower than the baseline
    slower = stored_run("regressed", slowdown=5.6 * 1.3)
    done = run_cli(vlmserve_cmd, home, "compare", baseline, slower, "--fail-on-regression")
    assert done.returncode == 1
    assert "REGRESSION" in done.stdout and "TTFT p50 30% higher" in done.stdout
    assert "regression(s) beyond the 10% noise threshold" in done.stdout
    # without --fail-on-regression the same comparison is informative only
    assert run_cli(vlmserve_cmd, home, "compare", baseline, slower).returncode == 0
    # a generous threshold treats 30% as noise
    loose = compare(load_source(baseline), load_source(slower), threshold=0.5)
    assert loose.regressions() == []
    # comparing different workloads is said out loud
    other = stored_run("longer-prompts", slowdown=5.6, input_len=2048)
    done = run_cli(vlmserve_cmd, home, "compare", baseline, other)
    assert "the loads differ (input_len 128 → 2048)" in done.stdout


def test_unknown_run_id_is_one_clear_line(home: Path, vlmserve_cmd: list[str]) -> None:
    stored_run("something", slowdown=1.0)
    for argv in (("report", "no-such-run"), ("compare", "no-such-run", "other")):
        done = run_cli(vlmserve_cmd, home, *argv)
        assert done.returncode == 2
        assert done.stderr.strip() == (
            "error: no stored run or sweep named 'no-such-run'; give a run id "
            "(see `vlmserve runs list`), a sweep directory or a sweep name"
        )


def test_report_of_a_stored_run_writes_html_and_markdown(home: Path, tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    run_id = stored_run("single", slowdown=1.0)
    done = run_cli(vlmserve_cmd, home, "report", run_id, "--html", str(tmp_path / "r.html"), "--md", str(tmp_path / "r.md"))
    assert done.returncode == 0, done.stderr
    assert "1 of 1 cells succeeded" in done.stdout
    assert (tmp_path / "r.html").stat().st_size > 1_000_000  # plotly.js is embedded
    assert "single" in (tmp_path / "r.md").read_text()


def test_negative_threshold_is_refused(home: Path) -> None:
    run_id = stored_run("x", slowdown=1.0)
    with pytest.raises(UserError, match="--threshold"):
        compare(load_source(run_id), load_source(run_id), threshold=-1)


def test_report_by_sweep_name_shows_cells_not_run_yet(home: Path, vlmserve_cmd: list[str]) -> None:
    from vlmserve.report.source import default_sweep_dir
    from vlmserve.sweep.manifest import SweepManifest
    from vlmserve.sweep.spec import parse_sweep_spec

    spec = parse_sweep_spec(
        {
            "name": "planned",
            "deployments": [{"name": "e", "endpoint": "http://127.0.0.1:1", "model": "m"}],
            "cells": [{"name": "c1", "concurrency": 1, "num_requests": 1}],
        },
        "planned",
    )
    SweepManifest.open_for_run(
        default_sweep_dir("planned"), spec.name, spec.fingerprint(), spec.model_dump(mode="json"), restart=False
    )
    done = run_cli(vlmserve_cmd, home, "report", "planned")
    assert done.returncode == 0, done.stderr
    assert "0 of 1 cells succeeded; 1 not run yet" in done.stdout
