"""The output side of a batch job, shared by both runners (built-in and Ray): line formats,
the tally of what the output holds, and the one writer that appends to it.

Output line: {"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error": {...} | null}

A line that cannot be sent is not fatal: it becomes an output line whose error has code
`malformed_line` and the input line number (`error.line`), so a rerun recognises it as
answered even when it had no usable custom_id (`scan.entry_key`).

Exactly once is kept here and in `scan`/`lock`: the output's lock is held by the one run
writing it; each result is one whole line written by `ResultFile.write` only after its
answer arrived; a write the file refuses is cut back to the last complete line; a rerun
skips every line already answered (`scan.scan_output` → `scan.entry_key`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vlmserve.batch.lines import MALFORMED, MalformedLine
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject

if TYPE_CHECKING:
    from vlmserve.batch.scan import InputScan, PriorResults

FSYNC_EVERY_S = 1.0


def _result_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def _encode(record: dict[str, object]) -> bytes:
    """One output line. Text is written as UTF-8; a lone surrogate (an answer echoing "\\ud800")
    cannot be, so such a record is written with \\u escapes instead (valid JSON, same value)."""
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    try:
        return (text + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def response_line(custom_id: str, status_code: int, request_id: str | None, body: object) -> bytes:
    """An answered request (any HTTP status the server gave, after retries)."""
    return _encode(
        {
            "id": _result_id(),
            "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body},
            "error": None,
        }
    )


def error_line(custom_id: str | None, code: str, message: str, line_no: int | None = None) -> bytes:
    """A request that could not be sent (malformed) or got no usable answer."""
    error: JSONObject = {"code": code, "message": message}
    if line_no is not None:
        error["line"] = line_no
    return _encode({"id": _result_id(), "custom_id": custom_id, "response": None, "error": error})


def failure_cause(record: JSONObject) -> str | None:
    """None for a success, else a short cause ('http_429', 'connection_error', 'malformed_line')."""
    error = record.get("error")
    if error:
        return str(error.get("code") or "error") if isinstance(error, dict) else "error"
    response = record.get("response")
    status = response.get("status_code") if isinstance(response, dict) else None
    if not isinstance(status, int):
        return "no_response"
    return None if status < 400 else f"http_{status}"


def usage_tokens(record: JSONObject) -> tuple[int, int]:
    """(prompt, completion) tokens of an answered output line."""
    response = record.get("response")
    return body_usage_tokens(response.get("body") if isinstance(response, dict) else None)


def body_usage_tokens(body: object) -> tuple[int, int]:
    """(prompt, completion) tokens from a response body's usage block; (0, 0) when absent."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    return (prompt if isinstance(prompt, int) else 0, completion if isinstance(completion, int) else 0)


@dataclass(frozen=True)
class Result:
    """One output line and what it counts as, ready to append."""

    line: bytes
    cause: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def answered(cls, custom_id: str, status_code: int, request_id: str | None, body: object) -> Result:
        cause = None if status_code < 400 else f"http_{status_code}"
        return cls(response_line(custom_id, status_code, request_id, body), cause, *body_usage_tokens(body))

    @classmethod
    def malformed(cls, entry: MalformedLine) -> Result:
        return cls(error_line(entry.custom_id, MALFORMED, entry.reason, entry.line_no), MALFORMED)


@dataclass
class BatchOutcome:
    """The whole job as the output file now stands, plus what this run did."""

    entries: int
    answered_before: int
    answered_now: int = 0
    succeeded: int = 0
    failed_by_cause: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    run_completion_tokens: int = 0
    no_answer: int = 0
    retries: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False
    stop_reason: str | None = None
    write_error: str | None = None
    """Why the output file refused a line (disk full, read-only); the job stopped there."""

    @classmethod
    def resuming(cls, scan: InputScan, prior: PriorResults) -> BatchOutcome:
        """The outcome before this run sends anything: the whole job as earlier runs left it."""
        return cls(
            entries=scan.entries,
            answered_before=scan.already_done,
            succeeded=prior.succeeded,
            failed_by_cause=Counter(prior.failed_by_cause),
            prompt_tokens=prior.prompt_tokens,
            completion_tokens=prior.completion_tokens,
        )

    @property
    def failed(self) -> int:
        return sum(self.failed_by_cause.values())

    @property
    def remaining(self) -> int:
        return self.entries - self.answered_before - self.answered_now

    def count(self, result: Result) -> None:
        """Account for a result that is now in the output."""
        self.answered_now += 1
        if result.cause is None:
            self.succeeded += 1
        else:
            self.failed_by_cause[result.cause] += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.run_completion_tokens += result.completion_tokens


class ResultFile:
    """The output file, opened for appending: whole lines only, fsynced once a second.

    A write the file refuses (disk full, read-only, I/O error) is cut back to the last
    complete line and `write_error` says why; every later write is refused, and the runner
    stops. Only lines actually in the file are counted in the outcome.
    """

    def __init__(self, path: Path, outcome: BatchOutcome) -> None:
        self.path = path
        self.outcome = outcome
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise UserError(f"--output: cannot open {path} for appending ({err.strerror}); pick a writable file") from None
        self.size = os.fstat(self.fd).st_size
        """Bytes of complete lines in the file: where a failed write is cut back to."""
        self.last_fsync = time.monotonic()

    @property
    def failed(self) -> bool:
        return self.outcome.write_error is not None

    def write(self, result: Result) -> bool:
        """Append one whole line and count it; False if the file refused it (then `failed`)."""
        if self.failed:
            return False
        try:
            view = memoryview(result.line)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
        except OSError as err:
            self._refused(err)
            return False
        self.size += len(result.line)
        self.outcome.count(result)
        now = time.monotonic()
        if now - self.last_fsync >= FSYNC_EVERY_S:
            self.last_fsync = now
            try:
                os.fsync(self.fd)
            except OSError as err:
                self._refused(err)  # this line is whole and counted; the job stops after it
        return True

    def _refused(self, err: OSError) -> None:
        reason = err.strerror or type(err).__name__
        self.outcome.write_error = f"cannot write {self.path}: {reason}"
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            pass  # the next run cuts a partial last line anyway (scan.drop_partial_tail)

    def close(self) -> None:
        """Fsync (a failure here is reported like a refused write) and close."""
        try:
            os.fsync(self.fd)
        except OSError as err:
            if not self.failed:
                self._refused(err)
        os.close(self.fd)
