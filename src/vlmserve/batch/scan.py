"""Streaming passes over the input and output files, keeping 8 bytes per line.

custom_ids are held as 64-bit BLAKE2b hashes in a sorted numpy array rather than as
strings: a million ids cost 8 MB instead of ~100 MB. A hash collision between two
different ids is checked exactly for duplicates (a second pass compares the strings);
for resuming, a collision would need ~4 billion lines to become likely.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlmserve.batch.lines import MALFORMED, BatchRequest, MalformedLine, parse_line
from vlmserve.batch.output import failure_cause, usage_tokens
from vlmserve.bounded_read import BATCH_LINE, BATCH_RESULT_LINE, iter_lines, loads_json, printable
from vlmserve.errors import UserError

_TAIL_CHUNK = 1 << 16


def id_key(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "little")


def line_key(line_no: int) -> int:
    """Key of a malformed line: its position, since it may have no usable custom_id."""
    return id_key(f"\x00line:{line_no}")


def entry_key(entry: BatchRequest | MalformedLine) -> int:
    return line_key(entry.line_no) if isinstance(entry, MalformedLine) else id_key(entry.custom_id)


class KeySet:
    """A frozen set of 64-bit keys: a sorted array searched by bisection."""

    def __init__(self, keys: array | None = None) -> None:
        self._sorted = np.sort(np.frombuffer(keys, dtype=np.uint64)) if keys else np.empty(0, np.uint64)

    def __len__(self) -> int:
        return int(self._sorted.size)

    def __contains__(self, key: int) -> bool:
        if not self._sorted.size:
            return False
        index = int(np.searchsorted(self._sorted, np.uint64(key)))
        return index < self._sorted.size and int(self._sorted[index]) == key

    def repeated(self) -> set[int]:
        """Keys that occur more than once."""
        values = self._sorted
        return {int(key) for key in values[1:][values[1:] == values[:-1]]}


def iter_input(path: Path) -> Iterator[tuple[int, BatchRequest | MalformedLine]]:
    """(line number, parsed entry) for every non-blank input line, streamed; LF, CRLF and CR
    end a line, and a line over the batch-line byte limit is a malformed entry (never held)."""
    with path.open("rb") as handle:
        for line_no, raw in enumerate(iter_lines(handle, BATCH_LINE.max_bytes), start=1):
            entry = parse_line(raw, line_no)
            if entry is not None:
                yield line_no, entry


@dataclass
class InputScan:
    """What the first pass learned: line counts, and how many are still to do."""

    entries: int = 0
    requests: int = 0
    malformed: int = 0
    already_done: int = 0


def scan_input(path: Path, done: KeySet) -> InputScan:
    """Count lines, refuse duplicate custom_ids (before anything is sent), count what is done."""
    if not path.is_file():
        raise UserError(f"{path}: no such file; give the batch input JSONL")
    scan = InputScan()
    ids = array("Q")
    for _, entry in iter_input(path):
        scan.entries += 1
        if isinstance(entry, MalformedLine):
            scan.malformed += 1
        else:
            scan.requests += 1
        if entry.custom_id is not None:
            ids.append(id_key(entry.custom_id))
        if entry_key(entry) in done:
            scan.already_done += 1
    if scan.entries == 0:
        raise UserError(f"{path}: no request lines; each line is a JSON object with custom_id, method, url, body")
    repeated = KeySet(ids).repeated()
    del ids
    if repeated:
        _refuse_duplicates(path, repeated)
    return scan


def _refuse_duplicates(path: Path, suspect_keys: set[int]) -> None:
    """Confirm suspected duplicates by their strings and name the first one."""
    seen: dict[str, list[int]] = {}
    for line_no, entry in iter_input(path):
        if entry.custom_id is not None and id_key(entry.custom_id) in suspect_keys:
            seen.setdefault(entry.custom_id, []).append(line_no)
    duplicates = {cid: lines for cid, lines in seen.items() if len(lines) > 1}
    if not duplicates:
        return  # only a hash collision between different ids
    first_id, lines = next(iter(duplicates.items()))
    more = f" ({len(duplicates) - 1} more ids repeat too)" if len(duplicates) > 1 else ""
    raise UserError(
        f"{path}: custom_id '{printable(first_id)}' appears on lines {', '.join(map(str, lines[:5]))}{more}; "
        "custom_ids must be unique — fix the file (nothing was sent)"
    )


@dataclass
class PriorResults:
    """Results already in the output file from earlier runs of the same job."""

    done: KeySet = field(default_factory=KeySet)
    lines: int = 0
    succeeded: int = 0
    failed_by_cause: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0


def drop_partial_tail(path: Path) -> int:
    """Cut a last line that a killed run left without its newline; returns bytes removed."""
    with path.open("r+b") as handle:
        size = handle.seek(0, 2)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        position = size
        while position > 0:
            start = max(0, position - _TAIL_CHUNK)
            handle.seek(start)
            chunk = handle.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                handle.truncate(keep)
                return size - keep
            position = start
        handle.truncate(0)
        return size


def scan_output(path: Path) -> PriorResults:
    """Read the existing output (if any) to resume: which lines are answered, and how."""
    prior = PriorResults()
    if not path.exists():
        return prior
    if not path.is_file():
        raise UserError(f"{path}: --output exists and is not a file; pick a file path")
    drop_partial_tail(path)
    keys = array("Q")
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            record = _result_record(raw, path, line_no)
            error = record.get("error") or {}
            if error.get("code") == MALFORMED and isinstance(error.get("line"), int):
                keys.append(line_key(error["line"]))
            else:
                keys.append(id_key(record["custom_id"]))
            prior.lines += 1
            cause = failure_cause(record)
            if cause is None:
                prior.succeeded += 1
            else:
                prior.failed_by_cause[cause] += 1
            prompt, completion = usage_tokens(record)
            prior.prompt_tokens += prompt
            prior.completion_tokens += completion
    prior.done = KeySet(keys)
    return prior


def _result_record(raw: bytes, path: Path, line_no: int) -> dict:
    try:
        record = loads_json(raw, BATCH_RESULT_LINE)
    except ValueError:  # not JSON, or over the bounds (Refused)
        record = None
    if (
        not isinstance(record, dict)
        or "custom_id" not in record
        or not (isinstance(record["custom_id"], str) or (record.get("error") or {}).get("code") == MALFORMED)
    ):
        raise UserError(
            f"{path}: line {line_no} is not a batch result line; --output must be this job's output file (or a new path)"
        )
    return record
