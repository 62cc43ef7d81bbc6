"""After the load: the steps that may fail without costing the run its records.

Rules kept:
- once the load has run, its records are the run; nothing done afterwards (re-counting
  answers with the server's /tokenize, the last /metrics scrape, saving to the history,
  writing --json-out and --records-out) may lose them;
- each such step runs through `PostRunWarnings.attempt`: a failure of any kind becomes one
  warning line (what failed, why, what is missing as a result) and the next step still runs;
- the warnings travel in the summary (`warnings`, a list of strings) and are printed as
  `warning: ...` lines; the CLI then exits `WARNINGS_EXIT_CODE`, so a script sees that
  the results are written but incomplete.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from vlmserve.errors import UserError
from vlmserve.results.run import RunResult

T = TypeVar("T")

WARNINGS_EXIT_CODE = 3
"""`vlmserve bench` exit status when the results were written but a post-run step failed."""


def describe_failure(err: BaseException) -> str:
    """One line for any exception: a UserError's own message, else its type and first line."""
    if isinstance(err, UserError):
        return err.message
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:200] if text else type(err).__name__


class PostRunWarnings:
    """Collects the failures of post-run steps as one-line warnings."""

    def __init__(self, messages: list[str] | None = None) -> None:
        self.messages: list[str] = messages if messages is not None else []

    def add(self, message: str) -> None:
        self.messages.append(" ".join(message.split()))

    def attempt(self, what: str, step: Callable[[], T], default: T, missing: str) -> T:
        """Run `step`; on any failure record `what failed (why); missing` and return `default`."""
        try:
            return step()
        except Exception as err:  # noqa: BLE001 - any failure here must not lose the records
            self.add(f"{what} failed ({describe_failure(err)}); {missing}")
            return default

    async def attempt_async(self, what: str, step: Callable[[], Awaitable[T]], default: T, missing: str) -> T:
        """`attempt` for a coroutine step."""
        try:
            return await step()
        except Exception as err:  # noqa: BLE001 - any failure here must not lose the records
            self.add(f"{what} failed ({describe_failure(err)}); {missing}")
            return default


def save_results(result: RunResult, *, store_run: bool, json_out: Path | None, records_out: Path | None) -> list[str]:
    """History, Parquet, then JSON (last, so it carries every warning); returns the failures.

    Each write is attempted even when an earlier one failed. The failures join the summary's
    `warnings` (beside workload warnings such as a prefix-cache mismatch), and
    `meta.post_run_failed` says a post-run step failed: what the exit code follows.
    """
    from vlmserve.results import store

    warnings = PostRunWarnings(result.warnings)
    already = len(warnings.messages)

    def note_failure() -> None:
        if len(warnings.messages) > already:
            result.meta.post_run_failed = True

    if store_run:
        warnings.attempt(
            f"saving the run in the history ({store.database_path()})",
            lambda: store.save_run(result),
            None,
            "it is missing from `vlmserve runs`",
        )
    if records_out is not None:
        warnings.attempt(
            f"writing {records_out}",
            lambda: store.write_records_parquet(result.records, records_out, meta=result.meta),
            None,
            "the records are not in that file",
        )
    note_failure()
    if json_out is not None:
        warnings.attempt(f"writing {json_out}", lambda: result.write_json(json_out), None, "the summary is not in that file")
    note_failure()
    return warnings.messages[already:]


def print_warnings(messages: list[str]) -> None:
    """One `warning: ...` line each on stderr (never wrapped, so scripts can grep them)."""
    for message in messages:
        print(f"warning: {message}", file=sys.stderr, flush=True)
