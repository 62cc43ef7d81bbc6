"""`runs import` on files the real tools wrote (tests/fixtures/imports/README.md says how each was made):
vlmserve's own --json-out, AIPerf 0.13, guidellm 0.8 and inference-perf 0.7, each against a sim engine.

Each file's figures are checked against the file's own numbers, then the stored run goes through
`report --html` and `compare` (the CLI, as a user runs them): neither may end in a traceback when a
figure is missing, and what one side lacks is said to be unknown.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.interop.test_import import FIXTURES, run_cli
from vlmserve.interop.importer import read_result_runs
from vlmserve.results.run import RunResult

VLMSERVE = FIXTURES / "vlmserve-bench.json"
AIPERF = FIXTURES / "aiperf-0.13-sim.json"
AIPERF_ERRORS = FIXTURES / "aiperf-0.13-sim-errors.json"
GUIDELLM = FIXTURES / "guidellm-0.8-sim.json"
INFERENCE_PERF = FIXTURES / "inference-perf-0.7" / "summary_lifecycle_metrics.json"

REAL_TOOL_FILES = {"vlmserve": VLMSERVE, "aiperf": AIPERF, "guidellm": GUIDELLM, "inference-perf": INFERENCE_PERF}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def only_run(path: Path, label: str | None = None) -> RunResult:
    runs = read_result_runs(path, label)
    assert len(runs) == 1
    return runs[0]


def test_vlmserve_json_out_reads_back_with_its_meta_and_simulated_flag() -> None:
    data = load(VLMSERVE)
    result = only_run(VLMSERVE)
    summary = result.summary.to_dict()
    assert result.meta.tool == "vlmserve" and result.meta.label == data["meta"]["label"] == "vlmserve-sim"
    assert result.meta.model == "sim-model" and result.simulated is True  # bench ran against the sim engine
    assert "run_id" not in result.meta and result.meta.original_run_id == data["meta"]["run_id"]
    for block in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert summary[block]["p99"] == data[block]["p99"]
    assert summary["throughput"] == data["throughput"] and summary["requests"] == data["requests"]


def test_aiperf_013_file_gives_model_load_and_figures_in_ms() -> None:
    data = load(AIPERF)
    result = only_run(AIPERF)
    summary = result.summary.to_dict()
    assert result.meta.model == "sim-model" and result.meta.tool_version == "0.13.0"
    assert result.meta.target == "http://127.0.0.1:18431"
    assert result.meta.load_spec == {"concurrency": 4, "api": "chat", "dataset": "synthetic", "input_len": 32, "output_len": 8}
    assert summary["ttft_ms"]["p50"] == pytest.approx(data["time_to_first_token"]["p50"])
    assert summary["e2e_ms"]["p99"] == pytest.approx(data["request_latency"]["p99"])
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(data["output_token_throughput"]["avg"])
    assert summary["duration_s"] == pytest.approx(data["benchmark_duration"]["avg"])
    assert summary["requests"] == {"total": 24, "completed": 24, "failed": 0}
    assert result.simulated is False  # the file cannot say what served it (--simulated says so)


def test_aiperf_warns_once_that_its_token_counts_are_its_own_retokenisation() -> None:
    data = load(AIPERF)
    warnings = only_run(AIPERF).warnings
    assert len(warnings) == 1 and "\n" not in warnings[0]
    client, server = data["total_osl"]["avg"], data["total_usage_completion_tokens"]["avg"]
    assert f"({client:.0f} output tokens by AIPerf's count, {server:.0f} by the server's usage)" in warnings[0]
    assert "--use-server-token-count" in warnings[0]
    with_server_counts = load(AIPERF)
    with_server_counts["input_config"]["endpoint"]["use_server_token_count"] = True
    from vlmserve.interop.aiperf import from_aiperf

    assert from_aiperf(with_server_counts).warnings == []


def test_aiperf_file_from_a_broken_run_says_so() -> None:
    data = load(AIPERF_ERRORS)
    result = only_run(AIPERF_ERRORS)
    failed = int(data["error_request_count"]["avg"])
    assert result.summary.to_dict()["requests"] == {"total": 24, "completed": 24 - failed, "failed": failed}
    broken = [line for line in result.warnings if "broken run" in line]
    assert broken == [
        f"this AIPerf file is from a broken run ({failed} of 24 requests failed): its figures "
        "cover only the requests that succeeded"
    ]


def test_aiperf_file_with_no_completed_request_says_so(tmp_path: Path) -> None:
    """AIPerf 0.13 writes no aggregate file when every request fails; an older or cancelled run's
    file with zero completed requests is built from the real errors file."""
    data = load(AIPERF_ERRORS)
    data["request_count"]["avg"] = 0
    data["was_cancelled"] = True
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(data))
    (line,) = [line for line in only_run(path).warnings if "broken run" in line]
    assert "no request completed" in line and "the run was cancelled" in line


def test_guidellm_benchmark_becomes_a_run_with_its_strategy_and_figures() -> None:
    data = load(GUIDELLM)
    benchmark = data["benchmarks"][0]
    metrics = benchmark["metrics"]
    result = only_run(GUIDELLM)
    summary = result.summary.to_dict()
    assert result.meta.tool == "guidellm" and result.meta.tool_version == data["metadata"]["guidellm_version"]
    assert result.meta.model == "sim-model" and result.meta.strategy == "concurrent@4"
    assert result.meta.load_spec == {
        "strategy": "concurrent",
        "dataset": "synthetic_text",
        "input_len": 32,
        "output_len": 8,
        "concurrency": 4,
        "api": "chat",
    }
    ttft = metrics["time_to_first_token_ms"]["successful"]
    assert summary["ttft_ms"]["p50"] == pytest.approx(ttft["percentiles"]["p50"])
    assert summary["ttft_ms"]["p99"] == pytest.approx(ttft["percentiles"]["p99"])
    assert summary["tpot_ms"]["mean"] == pytest.approx(metrics["time_per_output_token_ms"]["successful"]["mean"])
    assert summary["e2e_ms"]["p95"] == pytest.approx(metrics["request_latency"]["successful"]["percentiles"]["p95"] * 1000)
    assert summary["requests"] == {"total": 24, "completed": 24, "failed": 0}
    assert summary["tokens"]["output_total"] == round(metrics["output_token_count"]["successful"]["total_sum"])


def test_a_guidellm_sweep_becomes_one_run_per_benchmark_with_distinct_labels(tmp_path: Path) -> None:
    data = load(GUIDELLM)
    second = json.loads(json.dumps(data["benchmarks"][0]))
    second["config"]["strategy"] = {"type_": "constant", "rate": 2.0}
    data["benchmarks"].append(second)
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(data))
    runs = read_result_runs(path)
    assert [run.meta.label for run in runs] == [
        f"guidellm: {tmp_path.name}/benchmarks concurrent@4",
        f"guidellm: {tmp_path.name}/benchmarks constant@2",
    ]
    assert runs[1].meta.load_spec["rate"] == 2.0 and "concurrency" not in runs[1].meta.load_spec


def test_inference_perf_report_reads_seconds_as_ms_and_its_config_beside_it() -> None:
    data = load(INFERENCE_PERF)
    result = only_run(INFERENCE_PERF)
    summary = result.summary.to_dict()
    latency = data["successes"]["latency"]
    assert summary["ttft_ms"]["p50"] == pytest.approx(latency["time_to_first_token"]["median"] * 1000)
    assert summary["ttft_ms"]["p999"] == pytest.approx(latency["time_to_first_token"]["p99.9"] * 1000)
    assert summary["itl_ms"]["p90"] == pytest.approx(latency["inter_token_latency"]["p90"] * 1000)
    assert summary["throughput"]["requests_per_s"] == pytest.approx(data["successes"]["throughput"]["requests_per_sec"])
    assert result.meta.model == "sim-model"  # from config.yaml beside the report
    assert result.meta.load_spec == {"rate": 12.0, "api": "completions", "input_len": 32, "output_len": 8, "dataset": "random"}
    (warning,) = result.warnings
    assert warning.startswith("inference-perf's token counts disagree with the server's on 24 requests")


def test_inference_perf_report_without_its_config_has_unknown_model(tmp_path: Path) -> None:
    alone = tmp_path / "summary_lifecycle_metrics.json"
    shutil.copy(INFERENCE_PERF, alone)
    result = only_run(alone)
    assert result.meta.model is None and result.meta.load_spec == {}
    assert result.summary.to_dict()["ttft_ms"]["p50"] is not None


def test_labels_default_to_the_file_and_folder_and_label_sets_them(tmp_path: Path) -> None:
    run_a, run_b = tmp_path / "run-a", tmp_path / "run-b"
    for folder in (run_a, run_b):
        folder.mkdir()
        shutil.copy(AIPERF, folder / "profile_export_aiperf.json")
    labels = {only_run(folder / "profile_export_aiperf.json").meta.label for folder in (run_a, run_b)}
    assert labels == {"aiperf: run-a/profile_export_aiperf", "aiperf: run-b/profile_export_aiperf"}
    assert only_run(AIPERF, label="before the fix").meta.label == "before the fix"
    assert only_run(VLMSERVE, label="mine").meta.label == "mine"


@pytest.mark.parametrize("tool", sorted(REAL_TOOL_FILES))
def test_import_then_report_html_and_compare_work_on_each_real_tool_file(
    tool: str, tmp_path: Path, home: Path, vlmserve_cmd: list[str]
) -> None:
    """The Done-when path as a user runs it: import, `report --html`, `compare` both ways, exit 0, no traceback."""
    imported = run_cli(vlmserve_cmd, home, "runs", "import", str(REAL_TOOL_FILES[tool]), "--label", f"from-{tool}")
    assert imported.returncode == 0, imported.stderr
    assert f"'from-{tool}' (from {tool}; model sim-model;" in imported.stdout
    run_id = imported.stdout.split(" as run ")[1].split()[0]
    page = tmp_path / "report.html"
    report = run_cli(vlmserve_cmd, home, "report", run_id, "--html", str(page))
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    text = page.read_text()
    assert f"from-{tool}" in text and f"imported from {tool}" in text
    baseline = run_cli(vlmserve_cmd, home, "runs", "import", str(FIXTURES / "vllm-plain.json"))
    base_id = baseline.stdout.split(" as run ")[1].split()[0]
    for first, second in ((base_id, run_id), (run_id, base_id)):
        compared = run_cli(vlmserve_cmd, home, "compare", first, second, "--html", str(tmp_path / "compare.html"))
        assert compared.returncode == 0 and "Traceback" not in compared.stderr, compared.stderr
        assert "TTFT p50" in compared.stdout and "→ None" not in compared.stdout
        assert "not compared, unknown on one side:" in compared.stdout


def test_import_prints_each_warning_on_one_stderr_line_and_simulated_marks_the_run(home: Path, vlmserve_cmd: list[str]) -> None:
    done = run_cli(vlmserve_cmd, home, "runs", "import", str(AIPERF_ERRORS), "--simulated")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("warning: ") for line in lines)
    assert "re-tokenising" in lines[0] and "broken run (11 of 24 requests failed)" in lines[1]
    assert done.stdout.rstrip().endswith(", simulated)")
    listed = run_cli(vlmserve_cmd, home, "runs", "list")
    assert "simulated,from aiperf" in listed.stdout


def test_aiperf_non_streaming_file_has_ttft_unknown_and_still_reports(tmp_path: Path, home: Path) -> None:
    """A non-streaming AIPerf run has no TTFT or ITL blocks: they are unknown, the report still renders."""
    from vlmserve.interop.importer import import_result_file
    from vlmserve.report.compare import compare
    from vlmserve.report.html import render_html
    from vlmserve.report.source import load_source

    data = load(AIPERF)
    for name in ("time_to_first_token", "inter_token_latency", "time_to_second_token", "time_to_first_output_token"):
        data.pop(name, None)
    data["input_config"]["endpoint"]["streaming"] = False
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(data))
    ((run_id, result),) = import_result_file(path)
    assert result.summary.ttft_ms.p50 is None and "ttft_ms" not in result.summary.to_dict()
    assert result.summary.to_dict()["e2e_ms"]["p50"] == pytest.approx(data["request_latency"]["p50"])
    page = render_html(load_source(run_id))
    assert "imported from aiperf 0.13.0" in page
    ((other_id, _),) = import_result_file(VLMSERVE)
    (cell,) = compare(load_source(other_id), load_source(run_id)).cells
    assert "TTFT p50 (unknown in candidate)" in cell.unknown and "TPOT p50 (unknown in candidate)" in cell.unknown


@pytest.mark.parametrize("tool", ["vllm bench serve", "guidellm", "inference-perf"])
def test_every_format_says_when_its_file_is_from_a_broken_run(tool: str, tmp_path: Path) -> None:
    """Failed requests in the real files, as each tool counts them: one warning line, with the counts."""
    if tool == "vllm bench serve":
        data, name = load(FIXTURES / "vllm-plain.json"), "vllm.json"
        data["failed"] = 4
    elif tool == "guidellm":
        data, name = load(GUIDELLM), "benchmarks.json"
        data["benchmarks"][0]["metrics"]["request_totals"].update(errored=3, incomplete=1)
    else:
        data, name = load(INFERENCE_PERF), "summary_lifecycle_metrics.json"
        data["failures"]["count"] = 4
    path = tmp_path / name
    path.write_text(json.dumps(data))
    result = only_run(path)
    completed = result.summary.requests.completed
    assert result.summary.requests.failed == 4
    (line,) = [warning for warning in result.warnings if "broken run" in warning]
    assert f"(4 of {completed + 4} requests failed)" in line and "\n" not in line
