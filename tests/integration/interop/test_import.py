"""`vlmserve runs import` reads `vllm bench serve` result files (made by the real vLLM client, see
tests/fixtures/imports/README.md) into the history; `bench --result-format vllm` writes the same keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT, TESTS_ROOT
from tests.helpers.synthetic import saturating_records
from vlmserve.errors import UserError
from vlmserve.interop.importer import read_result_file
from vlmserve.interop.vllm_bench import from_vllm_result, to_vllm_result
from vlmserve.report.compare import compare
from vlmserve.report.html import render_html
from vlmserve.report.source import load_source
from vlmserve.results.metrics import summarize
from vlmserve.results.run import RunResult

FIXTURES = TESTS_ROOT / "fixtures" / "imports"
DETAILED, PLAIN = FIXTURES / "vllm-detailed.json", FIXTURES / "vllm-plain.json"


def run_cli(vlmserve_cmd: list[str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLMSERVE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*vlmserve_cmd, *args], capture_output=True, text=True, timeout=120, env=env)


def test_detailed_vllm_file_becomes_records_and_the_same_figures() -> None:
    data = json.loads(DETAILED.read_text())
    result = read_result_file(DETAILED)
    assert result.meta.tool == "vllm bench serve" and result.meta.label == "vllm bench serve: vllm-detailed"
    assert len(result.records) == data["completed"] == 12
    summary = result.summary.to_dict()
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(data["output_throughput"])
    assert summary["throughput"]["requests_per_s"] == pytest.approx(data["request_throughput"])
    for ours, theirs in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2el")):
        assert summary[ours]["p50"] == pytest.approx(data[f"median_{theirs}_ms"], rel=1e-6)
        assert summary[ours]["p99"] == pytest.approx(data[f"p99_{theirs}_ms"], rel=1e-6)
    assert result.meta.load_spec == {"concurrency": 4, "input_len": 27, "output_len": 8, "api": "completions"}


def test_plain_vllm_file_keeps_vllms_figures_without_records() -> None:
    data = json.loads(PLAIN.read_text())
    result = read_result_file(PLAIN)
    assert result.records == []
    assert result.summary.to_dict()["ttft_ms"]["p50"] == data["median_ttft_ms"]
    assert result.summary.to_dict()["ttft_ms"]["p99"] == data["p99_ttft_ms"]
    assert result.summary.to_dict()["requests"]["completed"] == data["completed"]


def test_runs_import_puts_vllm_runs_beside_vlmserve_runs(home: Path, vlmserve_cmd: list[str]) -> None:
    from vlmserve.results import store

    done = run_cli(vlmserve_cmd, home, "runs", "import", str(DETAILED))
    assert done.returncode == 0, done.stderr
    assert "(from vllm bench serve; model sim-model; 12 request records)" in done.stdout
    imported = done.stdout.split(" as run ")[1].split()[0]
    listed = run_cli(vlmserve_cmd, home, "runs", "list")
    assert imported in listed.stdout and "from vllm bench serve" in listed.stdout

    records = saturating_records(4, output_tokens=8)
    summary = summarize(records, None)
    summary.meta = {
        "label": "ours",
        "model": "sim-model",
        "load_spec": {"dataset": "random", "input_len": 32, "output_len": 8, "concurrency": 4},
    }
    ours = store.save_run(RunResult(records=records, summary=summary))
    comparison = compare(load_source(imported), load_source(ours))
    assert any(line.startswith("TTFT p50") for line in comparison.headlines())
    page = render_html(load_source(imported))
    assert 'id="chart-cdf-0"' in page and 'id="chart-timeline-0"' in page, "imported records feed the plots"


@pytest.mark.parametrize(
    "content, expected",
    [
        ("not json at all", "is not JSON (line 1"),
        ('{"benchmarks": []}', "is JSON but not a result file vlmserve reads"),
        ("[1, 2, 3]", "is JSON but not a result file vlmserve reads"),
        (
            '{"duration": 1, "completed": 2, "request_throughput": 2, "output_throughput": 1, "request_rate": "fast",'
            ' "max_concurrency": null}',
            "looks like vllm bench serve output but a field is malformed",
        ),
        (
            '{"duration": 1, "completed": 2, "request_throughput": 2, "output_throughput": 1, "start_times": [1],'
            ' "ttfts": [], "itls": [], "latencies": [], "input_lens": [], "output_lens": [], "errors": []}',
            "the per-request lists of this vllm bench serve file differ in length",
        ),
    ],
)
def test_foreign_or_damaged_files_get_one_line(
    content: str, expected: str, tmp_path: Path, home: Path, vlmserve_cmd: list[str]
) -> None:
    bad = tmp_path / "result.json"
    bad.write_text(content)
    with pytest.raises(UserError) as caught:
        read_result_file(bad)
    assert expected in caught.value.message
    done = run_cli(vlmserve_cmd, home, "runs", "import", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and expected in done.stderr


def test_missing_file_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file; give a result file of vlmserve"):
        read_result_file(tmp_path / "absent.json")


def test_vllm_format_has_vllms_keys_and_types_and_reads_back() -> None:
    """What `bench --result-format vllm` writes: every key of the real file, same JSON types."""
    real = json.loads(DETAILED.read_text())
    records = saturating_records(4, output_tokens=8, requests=12)
    summary = summarize(records, None)
    summary.meta = {
        "label": "ours",
        "model": "sim-model",
        "started_at": "2026-11-23T21:00:00+00:00",
        "load_spec": {"api": "completions", "concurrency": 4, "burstiness": 1.0},
    }
    written = json.loads(json.dumps(to_vllm_result(RunResult(records=records, summary=summary))))
    assert set(real) <= set(written), set(real) - set(written)
    for key, value in real.items():
        if value is not None and written[key] is not None:
            kind = (int, float) if isinstance(value, (int, float)) else type(value)
            assert isinstance(written[key], kind), f"{key}: {type(written[key]).__name__} vs {type(value).__name__}"
    assert written["request_rate"] == "inf" and written["max_concurrency"] == 4 and written["date"] == "20261123-210000"
    assert written["max_concurrent_requests"] == 4 and written["max_output_tokens_per_s"] > 0
    back = from_vllm_result(written)
    assert back.summary.to_dict()["ttft_ms"]["p50"] == pytest.approx(summary.to_dict()["ttft_ms"]["p50"])
    assert back.summary.to_dict()["throughput"]["output_tokens_per_s"] == pytest.approx(
        summary.to_dict()["throughput"]["output_tokens_per_s"]
    )
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from bench_vs_vllm_engine import vllm_figures  # the repository's own reader of vLLM result files

    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vlmserve-vllm-format-{os.getpid()}.json"
    path.write_text(json.dumps(written))
    try:
        assert vllm_figures(path)["completed"] == 12
    finally:
        path.unlink()


def test_aiperf_aggregate_file_imports_as_figures() -> None:
    result = read_result_file(FIXTURES / "profile_export_aiperf.json")
    assert result.meta.tool == "aiperf" and result.records == []
    assert result.meta.model == "openai/gpt-oss-20b" and result.meta.load_spec["concurrency"] == 100
    assert result.summary.to_dict()["ttft_ms"]["p50"] == pytest.approx(787.54, abs=0.01)
    assert result.summary.to_dict()["e2e_ms"]["p99"] == pytest.approx(9381.63, abs=0.01)
    assert result.summary.to_dict()["tpot_ms"]["p50"] == pytest.approx(51.98)
    assert result.summary.to_dict()["throughput"]["output_tokens_per_s"] == pytest.approx(1274.63)
    assert result.summary.to_dict()["requests"] == {"total": 200, "completed": 200, "failed": 0}
