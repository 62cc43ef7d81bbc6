"""Hostile result files for `runs import`: one `error:` line naming the file and the bound, exit 2;
labels are stored with their control characters shown, so no listing obeys an escape sequence."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.interop.test_import import DETAILED, run_cli
from vlmserve.bounded_read import RESULT_FILE

REQUIRED = '"duration": 1, "completed": 2, "request_throughput": 2, "output_throughput": 1'


def one_error_line(vlmserve_cmd: list[str], home_dir: Path, path: Path) -> str:
    done = run_cli(vlmserve_cmd, home_dir, "runs", "import", str(path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    return done.stderr.strip()


@pytest.mark.hostile(
    "runs import: 100,000 nested brackets, a 5,000-digit integer, NaN, -Infinity, 1e999: one line naming the bound each"
)
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "{" + REQUIRED + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
            f"nests deeper than {RESULT_FILE.max_depth} levels (the limit for a result file)",
        ),
        ("{" + REQUIRED + ', "failed": ' + "9" * 5000 + "}", "has an integer of 5,000 digits, over the 40-digit limit"),
        ("{" + REQUIRED + ', "failed": NaN}', "has NaN, which is not a finite number"),
        ("{" + REQUIRED.replace('"duration": 1', '"duration": -Infinity') + "}", "has -Infinity, which is not a finite number"),
        ("{" + REQUIRED.replace('"duration": 1', '"duration": 1e999') + "}", "has the number 1e999, which is not finite"),
        (
            "{" + REQUIRED + ', "request_rate": "nan"}',
            "a field is malformed (ValueError: request_rate is nan, not a finite number)",
        ),
    ],
    ids=["deep", "huge-integer", "nan", "minus-infinity", "1e999", "nan-as-text"],
)
def test_hostile_numbers_and_nesting_are_one_line(
    content: str, expected: str, tmp_path: Path, home: Path, vlmserve_cmd: list[str]
) -> None:
    path = tmp_path / "result.json"
    path.write_text(content)
    line = one_error_line(vlmserve_cmd, home, path)
    assert line.startswith("error: ") and str(path) in line and expected in line, line


@pytest.mark.hostile("runs import: a detailed file of a million requests is refused by its value count before it is parsed")
def test_a_million_records_is_refused_by_count(tmp_path: Path, home: Path, vlmserve_cmd: list[str]) -> None:
    count = 1_000_000
    path = tmp_path / "huge.json"
    with path.open("w") as handle:
        handle.write("{" + REQUIRED)
        for name in ("start_times", "ttfts", "latencies", "input_lens", "output_lens"):
            handle.write(f', "{name}": [' + ",".join(["1"] * count) + "]")
        handle.write(', "itls": [' + ",".join(["[0.1]"] * count) + '], "errors": [' + ",".join(['""'] * count) + "]}")
    line = one_error_line(vlmserve_cmd, home, path)
    assert f"error: {path}: holds about 8,000,0" in line
    assert f"values, over the {RESULT_FILE.max_items:,} limit for a result file" in line
    assert "save it without --save-detailed" in line


@pytest.mark.hostile("runs import: a label with terminal escape sequences is stored and listed with them shown, not obeyed")
def test_label_escape_sequences_are_shown_not_obeyed(tmp_path: Path, home: Path, vlmserve_cmd: list[str]) -> None:
    data = json.loads(DETAILED.read_text())
    data["label"] = "ok\x1b[2J\x1b]0;owned\x07\rfake"
    data["model_id"] = "m\x1b[31m"
    path = tmp_path / "escapes.json"
    path.write_text(json.dumps(data))
    done = run_cli(vlmserve_cmd, home, "runs", "import", str(path))
    assert done.returncode == 0, done.stderr
    listed = run_cli(vlmserve_cmd, home, "runs", "list")
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\r" not in listed.stdout and "\x07" not in listed.stdout
    assert "ok\\x1b[2J" in listed.stdout


FORMATS_DIR = DETAILED.parent


def _real(name: str) -> dict:
    data: dict = json.loads((FORMATS_DIR / name).read_text())
    return data


def _guidellm_without_benchmarks() -> str:
    data = _real("guidellm-0.8-sim.json")
    data["benchmarks"] = []
    return json.dumps(data)


def _guidellm_metrics_not_an_object() -> str:
    data = _real("guidellm-0.8-sim.json")
    data["benchmarks"][0]["metrics"] = "fast"
    return json.dumps(data)


def _guidellm_deeply_nested() -> str:
    data = _real("guidellm-0.8-sim.json")
    return json.dumps(data)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _vlmserve_count_not_a_number() -> str:
    data = _real("vlmserve-bench.json")
    data["requests"]["completed"] = "many"
    return json.dumps(data)


def _inference_perf_count_not_a_number() -> str:
    data = _real("inference-perf-0.7/summary_lifecycle_metrics.json")
    data["successes"]["count"] = "x"
    return json.dumps(data)


def _aiperf_without_its_required_blocks() -> str:
    data = _real("aiperf-0.13-sim.json")
    del data["request_throughput"]
    del data["benchmark_duration"]
    return json.dumps(data)


@pytest.mark.hostile(
    "runs import: truncated, foreign, empty or malformed guidellm / inference-perf / AIPerf / vlmserve files: one error line each"
)
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (lambda: (FORMATS_DIR / "guidellm-0.8-sim.json").read_text()[:5000], "is not JSON (line"),
        (lambda: json.dumps({"benchmarks": [{}], "metadata": {"version": 2}}), "is JSON but not a result file vlmserve reads"),
        (lambda: json.dumps({"successes": [], "failures": {}, "benchmark_time_seconds": 1}), "is JSON but not a result file"),
        (_aiperf_without_its_required_blocks, "is JSON but not a result file vlmserve reads"),
        (_guidellm_without_benchmarks, "this guidellm file holds no benchmark"),
        (
            _guidellm_metrics_not_an_object,
            "looks like guidellm output but a field is malformed (ValueError: a benchmark has no metrics object)",
        ),
        (_guidellm_deeply_nested, f"nests deeper than {RESULT_FILE.max_depth} levels"),
        (_vlmserve_count_not_a_number, "looks like vlmserve output but a field is malformed (ValidationError"),
        (_inference_perf_count_not_a_number, "looks like inference-perf output but a field is malformed (ValueError"),
    ],
    ids=[
        "guidellm-truncated",
        "guidellm-without-version",
        "inference-perf-successes-a-list",
        "aiperf-missing-blocks",
        "guidellm-no-benchmark",
        "guidellm-metrics-a-string",
        "guidellm-deep",
        "vlmserve-count-a-word",
        "inference-perf-count-a-word",
    ],
)
def test_bad_files_of_every_format_are_one_line(
    content: Callable[[], str], expected: str, tmp_path: Path, home: Path, vlmserve_cmd: list[str]
) -> None:
    path = tmp_path / "result.json"
    path.write_text(content())
    line = one_error_line(vlmserve_cmd, home, path)
    assert line.startswith(f"error: {path}") and expected in line, line


@pytest.mark.hostile("runs import: an inference-perf report beside a billion-laughs config.yaml imports with the model unknown")
def test_hostile_config_beside_an_inference_perf_report_is_ignored(tmp_path: Path, home: Path, vlmserve_cmd: list[str]) -> None:
    report = tmp_path / "summary_lifecycle_metrics.json"
    report.write_text((FORMATS_DIR / "inference-perf-0.7" / "summary_lifecycle_metrics.json").read_text())
    laughs = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [f"a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 10)]
    (tmp_path / "config.yaml").write_text("\n".join(laughs) + "\nserver: {model_name: *a9}\n")
    done = run_cli(vlmserve_cmd, home, "runs", "import", str(report))
    assert done.returncode == 0, done.stderr
    assert "(from inference-perf; model unknown;" in done.stdout
