"""Hostile input lines: each is answered by an error record, and every other line is still sent.

A real `vlmserve batch` process against the real sim engine; the output is read back line by
line in the OpenAI Batch format (`custom_id`, `response`, `error`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.batch.test_batch_job import read_output, request_line, run_batch, sim  # noqa: F401 (fixture)
from vlmserve.bounded_read import BATCH_LINE


def answered_and_errors(output: Path) -> tuple[set[str], dict[int, dict]]:
    records = read_output(output)
    answered = {record["custom_id"] for record in records if record["error"] is None and record["response"]["status_code"] == 200}
    errors = {record["error"]["line"]: record for record in records if record["error"] is not None}
    return answered, errors


def write_raw(path: Path, lines: list[bytes], end: bytes = b"\n") -> Path:
    path.write_bytes(end.join(lines) + end)
    return path


def good(index: int) -> bytes:
    return json.dumps(request_line(index)).encode()


@pytest.mark.hostile(
    "batch: a 100,000-deep line and a lone-surrogate custom_id among good lines: two error records, every other line answered"
)
def test_deep_line_and_surrogate_id_are_error_records_and_the_job_goes_on(tmp_path, vlmserve_cmd, sim) -> None:  # noqa: F811
    deep = (
        b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}"
    )
    surrogate = json.dumps({**request_line(99), "custom_id": "\ud800bad"}).encode()  # written as the escape \ud800
    assert b"\\ud800" in surrogate
    input_path = write_raw(tmp_path / "in.jsonl", [good(0), deep, good(1), surrogate, good(2)])
    output = tmp_path / "out.jsonl"
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1 and "error: 2 lines failed" in done.stderr
    answered, errors = answered_and_errors(output)
    assert answered == {"req-0", "req-1", "req-2"}
    assert set(errors) == {2, 4}
    assert errors[2]["custom_id"] is None and errors[2]["error"]["code"] == "malformed_line"
    assert (
        errors[2]["error"]["message"] == f"line 2: nests deeper than {BATCH_LINE.max_depth} levels (the limit for a batch line)"
    )
    assert errors[4]["custom_id"] is None
    assert errors[4]["error"]["message"].startswith("line 4: 'custom_id' is not valid Unicode (it holds a lone surrogate")
    # the rerun sees every line answered
    again = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert again.returncode == 1 and len(read_output(output)) == 5


@pytest.mark.hostile("batch: huge integer, NaN and 1e999 in lines: error records naming the bound, the rest answered")
def test_numbers_out_of_bounds_are_error_records(tmp_path, vlmserve_cmd, sim) -> None:  # noqa: F811
    def with_max_tokens(index: int, value: str) -> bytes:
        return good(index).replace(b'"max_tokens": 4', f'"max_tokens": {value}'.encode())

    input_path = write_raw(
        tmp_path / "in.jsonl",
        [good(0), with_max_tokens(10, "9" * 5000), with_max_tokens(11, "NaN"), with_max_tokens(12, "1e999"), good(1)],
    )
    output = tmp_path / "out.jsonl"
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert "Traceback" not in done.stderr and done.returncode == 1, done.stderr
    answered, errors = answered_and_errors(output)
    assert answered == {"req-0", "req-1"}
    assert errors[2]["error"]["message"] == "line 2: has an integer of 5,000 digits, over the 40-digit limit for a batch line"
    assert (
        errors[3]["error"]["message"] == "line 3: has NaN, which is not a finite number; a batch line takes finite numbers only"
    )
    assert errors[4]["error"]["message"].startswith("line 4: has the number 1e999, which is not finite")


@pytest.mark.hostile("batch: an input file with CR-only (and CRLF) line ends is read line by line, every request answered")
@pytest.mark.parametrize("end", [b"\r", b"\r\n"])
def test_cr_and_crlf_line_ends_are_line_ends(tmp_path, vlmserve_cmd, sim, end: bytes) -> None:  # noqa: F811
    input_path = write_raw(tmp_path / "in.jsonl", [good(index) for index in range(5)], end=end)
    output = tmp_path / "out.jsonl"
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert done.returncode == 0, done.stderr
    answered, errors = answered_and_errors(output)
    assert answered == {f"req-{index}" for index in range(5)} and not errors
