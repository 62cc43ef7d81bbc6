"""The pieces that make resuming safe: partial-tail repair, hashed id sets, Retry-After."""

from __future__ import annotations

import email.utils
import json
import time
from array import array
from pathlib import Path

import pytest

from vlmserve.batch.output import error_line, response_line
from vlmserve.batch.runner import api_root
from vlmserve.batch.scan import KeySet, drop_partial_tail, id_key, scan_output
from vlmserve.batch.send import MAX_RETRY_AFTER_S, retry_after_s


def test_partial_last_line_is_cut_and_complete_lines_kept(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    good = response_line("a", 200, "r1", {"usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    path.write_bytes(good + b'{"id":"batch_req_1","custom_id":"b","resp')
    assert drop_partial_tail(path) > 0
    assert path.read_bytes() == good
    assert drop_partial_tail(path) == 0


def test_partial_line_longer_than_one_read_chunk(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"x" * 200_000)  # a single unterminated line: nothing complete to keep
    drop_partial_tail(path)
    assert path.read_bytes() == b""


def test_scan_output_counts_prior_results(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(
        response_line("a", 200, None, {"usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        + response_line("b", 400, None, {"error": {"message": "bad"}})
        + error_line(None, "malformed_line", "line 3: not valid JSON", 3)
    )
    prior = scan_output(path)
    assert prior.lines == 3 and prior.succeeded == 1
    assert prior.failed_by_cause == {"http_400": 1, "malformed_line": 1}
    assert (prior.prompt_tokens, prior.completion_tokens) == (3, 2)
    assert id_key("a") in prior.done and id_key("b") in prior.done and id_key("c") not in prior.done
    assert json.loads(path.read_bytes().splitlines()[2])["error"]["line"] == 3


def test_keyset_membership_and_repeats() -> None:
    keys = array("Q", [id_key(f"id-{i}") for i in range(1000)] + [id_key("id-5")])
    key_set = KeySet(keys)
    assert id_key("id-999") in key_set and id_key("id-1000") not in key_set
    assert key_set.repeated() == {id_key("id-5")}
    assert id_key("x") not in KeySet()


def test_retry_after_seconds_and_dates() -> None:
    assert retry_after_s("2") == 2.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("100000") == MAX_RETRY_AFTER_S
    in_five = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 <= retry_after_s(in_five) <= 5.0


@pytest.mark.parametrize(
    "given, root",
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
        ("https://host/prefix/v1", "https://host/prefix"),
    ],
)
def test_api_root(given: str, root: str) -> None:
    assert api_root(given) == root
