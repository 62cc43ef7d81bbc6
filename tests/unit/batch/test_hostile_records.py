"""Batch lines that cannot be written or read back as they are: the job and its resume go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmserve.batch.lines import MalformedLine, parse_line
from vlmserve.batch.output import Result
from vlmserve.batch.scan import scan_output
from vlmserve.errors import UserError


def test_an_answer_with_a_lone_surrogate_is_written_escaped() -> None:
    line = Result.answered("id-1", 200, "r", {"text": "\ud800 echoed"}).line
    assert line.endswith(b"\n") and b"\\ud800" in line
    assert json.loads(line)["response"]["body"]["text"] == "\ud800 echoed"


@pytest.mark.hostile(
    "batch: a custom_id with a lone surrogate escape is an error record without the id, never an encode traceback"
)
def test_a_surrogate_custom_id_is_malformed_and_its_record_is_writable() -> None:
    entry = parse_line(b'{"custom_id": "a\\udc80", "method": "POST", "url": "/v1/completions", "body": {}}', 3)
    assert isinstance(entry, MalformedLine) and entry.custom_id is None
    assert json.loads(Result.malformed(entry).line)["error"]["line"] == 3


def test_a_line_over_the_byte_limit_is_malformed() -> None:
    entry = parse_line(None, 9)
    assert isinstance(entry, MalformedLine)
    assert entry.reason.startswith("line 9: is over the 67,108,864-byte limit for a batch line")


@pytest.mark.hostile("batch resume: an output file with a 100,000-deep line is one line naming the file, not a RecursionError")
def test_resume_over_a_deep_output_line_is_one_line(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_bytes(b'{"custom_id": "x", "response": ' + b"[" * 100_000 + b"]" * 100_000 + b', "error": null}\n')
    with pytest.raises(UserError, match="line 1 is not a batch result line"):
        scan_output(output)
