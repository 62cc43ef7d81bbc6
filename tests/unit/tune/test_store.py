"""The tune store: finished candidates survive a restart of the process; a foreign or broken file is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmserve.errors import UserError
from vlmserve.tune.store import STORE_FILE, CandidateRecord, Interval, TuneStore, read_store


def _record(candidate_id: str, order: int, goodput: float | None = 4.0) -> CandidateRecord:
    failed = goodput is None
    return CandidateRecord(
        id=candidate_id,
        label=candidate_id,
        params={"max_num_seqs": 16},
        order=order,
        status="failed" if failed else "measured",
        goodput_rps=goodput,
        interval=None if failed else Interval(low=goodput or 0.0, high=(goodput or 0.0) * 1.2),
        reason="start failed" if failed else None,
        log="/tmp/x.log" if failed else None,
    )


def test_a_reopened_store_holds_every_recorded_candidate(tmp_path: Path) -> None:
    store = TuneStore(tmp_path, "fp1", {"base": "b"})
    store.record(_record("c1", 0))
    store.record(_record("c2", 1, goodput=None))
    again = TuneStore(tmp_path, "fp1", {"base": "b"})
    assert [record.id for record in again.records] == ["c1", "c2"]
    assert again.finished("c2") is not None and again.finished("c2").log == "/tmp/x.log"  # type: ignore[union-attr]
    assert again.finished("c1").interval == Interval(low=4.0, high=4.8)  # type: ignore[union-attr]
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file is renamed over the store"


def test_restart_forgets_and_a_different_study_is_refused(tmp_path: Path) -> None:
    TuneStore(tmp_path, "fp1", {}).record(_record("c1", 0))
    with pytest.raises(UserError, match="holds a different tune .* use another --out, or --restart to forget it"):
        TuneStore(tmp_path, "fp2", {})
    assert TuneStore(tmp_path, "fp2", {}, restart=True).records == []
    assert read_store(tmp_path / STORE_FILE).fingerprint == "fp2"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"version": 1, "fingerprint": "fp", "study": {}, "candidates": [{"id": ', "not readable JSON"),
        ("\xff\xfe garbage", "not readable JSON"),
        ('["a", "list"]', "field '(top level)'"),
        ('{"version": 1, "fingerprint": "fp", "study": {}, "candidates": [{"id": "c1"}]}', "field 'candidates.0.label'"),
        ('{"version": 1, "fingerprint": "fp", "study": {}, "candidates": [], "extra": 1}', "field 'extra'"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
    ],
)
@pytest.mark.hostile("tune --out DIR: a truncated, non-JSON, mis-shaped or 100,000-deep tune.json is one line, never a traceback")
def test_a_corrupt_store_is_one_line(tmp_path: Path, content: str, why: str) -> None:
    (tmp_path / STORE_FILE).write_bytes(
        content.encode("utf-8", "surrogateescape") if "\xff" not in content else b"\xff\xfe garbage"
    )
    with pytest.raises(UserError) as raised:
        TuneStore(tmp_path, "fp", {})
    message = raised.value.message
    assert message.startswith(f"{tmp_path / STORE_FILE}: not a tune store (") and why in message, message
    assert message.endswith("remove it, or pass --restart to start the tune over") and "\n" not in message


@pytest.mark.hostile("tune --out DIR: a tune.json from another store version is refused, not misread")
def test_another_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / STORE_FILE).write_text(json.dumps({"version": 99, "fingerprint": "fp", "study": {}}))
    with pytest.raises(UserError, match="a tune store of version 99, this vlmserve reads 1"):
        TuneStore(tmp_path, "fp", {})
