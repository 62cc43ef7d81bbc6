"""Honest labels: simulated runs say so everywhere; unknown values read unknown; SLO verdicts in words."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from rich.console import Console

from tests.helpers.bench_fixtures import bench_args
from vlmserve.bench.console import print_summary, slo_verdict
from vlmserve.results import store
from vlmserve.results.summary import RunSummary, SloCheck


def test_a_run_against_the_sim_engine_is_labelled_simulated_everywhere(sim, cli, tmp_path):
    out, parquet = tmp_path / "run.json", tmp_path / "records.parquet"
    result = cli(
        *bench_args(
            sim,
            "--concurrency",
            2,
            "--num-requests",
            4,
            "--input-len",
            16,
            "--output-len",
            4,
            "--slo",
            "ttft_p95=1ms",
            "--json-out",
            out,
            "--records-out",
            parquet,
        )
    )
    assert result.code == 0, result.err
    summary = json.loads(out.read_text())
    assert summary["meta"]["simulated"] is True
    assert "SIMULATED" in result.out
    table = pq.read_table(parquet)
    assert all(table.column("simulated").to_pylist())
    assert table.schema.metadata[b"vlmserve.simulated"] == b"true"
    row = store.list_runs(limit=1)[0]
    assert row["simulated"] is True
    listed = cli("runs", "list")
    assert "simulated" in listed.out
    # the verdict names the unit and says missed in words
    assert "ttft_p95 " in result.out and "ms > 1 ms: missed" in result.out


def test_unknown_server_figures_read_unknown_not_zero():
    summary = {
        "meta": {},
        "requests": {"completed": 1, "failed": 0},
        "duration_s": 1.0,
        "throughput": {"requests_per_s": 1.0, "output_tokens_per_s": 1.0, "total_tokens_per_s": 1.0, "chunks_per_s": 1.0},
        "server": {"available": True, "prefix_cache_hit_rate": None, "peak_kv_cache_usage": None},
    }
    console = Console(record=True, width=300)
    print_summary(console, RunSummary.model_validate(summary))
    text = console.export_text()
    assert "peak KV usage unknown" in text and "prefix-cache hit rate unknown" in text
    assert "0%" not in text and "0.0%" not in text


def test_slo_verdict_wording():
    assert slo_verdict("ttft_p95", SloCheck(measured_ms=47.7, bound_ms=40.0, met=False)) == "ttft_p95 47.7 ms > 40 ms: missed"
    assert slo_verdict("tpot_p99", SloCheck(measured_ms=12.0, bound_ms=50.0, met=True)) == "tpot_p99 12.0 ms ≤ 50 ms: met"


def test_runs_list_at_80_columns_drops_whole_columns_and_says_which(sim, cli, monkeypatch):
    """A narrow terminal gets whole columns (no cell cut to '…'), the run id and the key figures
    first, and a line naming what was left out; --wide keeps every column."""
    from vlmserve.cli import bench as bench_cli

    assert cli(*bench_args(sim, "--concurrency", 2, "--num-requests", 4, "--output-len", 4, "--label", "clinic-a")).code == 0
    monkeypatch.setattr(bench_cli, "_wide_console", lambda: Console(width=80, force_terminal=False))
    listed = cli("runs", "list")
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    table_lines = [line for line in lines if not line.startswith("(")]
    assert all(len(line) <= 80 for line in table_lines), lines
    assert "…" not in listed.out
    run_id = store.list_runs(limit=1)[0]["run_id"]
    assert run_id in listed.out and "clinic-a" in listed.out and "simulated" in listed.out
    assert "TTFT p50" in listed.out
    assert lines[-1].startswith("(") and "left out at 80 columns: --wide shows every column" in lines[-1]
    wide = cli("runs", "list", "--wide")
    assert all(column in wide.out for column in bench_cli.RUNS_LIST_COLUMNS)
