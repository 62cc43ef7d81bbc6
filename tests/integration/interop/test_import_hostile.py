"""Hostile result files for `runs import`: one `error:` line naming the file and the bound, exit 2;
labels are stored with their control characters shown, so no listing obeys an escape sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.interop.test_import import DETAILED, home, run_cli  # noqa: F401 (fixture)
from vlmserve.bounded_read import RESULT_FILE

REQUIRED = '"duration": 1, "completed": 2, "request_throughput": 2, "output_throughput": 1'


def one_error_line(vlmserve_cmd: list[str], home_dir: Path, path: Path) -> str:
    done = run_cli(vlmserve_cmd, home_dir, "runs", "import", str(path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    return done.stderr.strip()


@pytest.mark.hostile("runs import: 100,000 nested brackets, a 5,000-digit integer, NaN, -Infinity, 1e999: one line naming the bound each")
@pytest.mark.parametrize(("content", "expected"), [
    ("{" + REQUIRED + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
     f"nests deeper than {RESULT_FILE.max_depth} levels (the limit for a result file)"),
    ("{" + REQUIRED + ', "failed": ' + "9" * 5000 + "}", "has an integer of 5,000 digits, over the 40-digit limit"),
    ("{" + REQUIRED + ', "failed": NaN}', "has NaN, which is not a finite number"),
    ("{" + REQUIRED.replace('"duration": 1', '"duration": -Infinity') + "}", "has -Infinity, which is not a finite number"),
    ("{" + REQUIRED.replace('"duration": 1', '"duration": 1e999') + "}", "has the number 1e999, which is not finite"),
    ("{" + REQUIRED + ', "request_rate": "nan"}', "a field is malformed (ValueError: request_rate is nan, not a finite number)"),
], ids=["deep", "huge-integer", "nan", "minus-infinity", "1e999", "nan-as-text"])
def test_hostile_numbers_and_nesting_are_one_line(content: str, expected: str, tmp_path: Path, home: Path,  # noqa: F811
                                                  vlmserve_cmd: list[str]) -> None:
    path = tmp_path / "result.json"
    path.write_text(content)
    line = one_error_line(vlmserve_cmd, home, path)
    assert line.startswith("error: ") and str(path) in line and expected in line, line


@pytest.mark.hostile("runs import: a detailed file of a million requests is refused by its value count before it is parsed")
def test_a_million_records_is_refused_by_count(tmp_path: Path, home: Path, vlmserve_cmd: list[str]) -> None:  # noqa: F811
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
def test_label_escape_sequences_are_shown_not_obeyed(tmp_path: Path, home: Path, vlmserve_cmd: list[str]) -> None:  # noqa: F811
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
