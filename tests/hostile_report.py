"""A pytest plugin that turns the hostile-input suite into the table in docs/security.md.

Every test marked `@pytest.mark.hostile("case")` replays one hostile input or fault. For each,
this plugin records the outcome, counts Python tracebacks that reached any log the test left
behind (pytest's captured stdout/stderr/logging and every `*.log` file under the test's
`tmp_path`), and takes the number of requests lost from the test itself when it measured one
(`record_property("requests_lost", n)`; `requests_sent` likewise).

Nothing is written unless `VLMSERVE_HOSTILE_REPORT` names a file: `scripts/hostile-table` sets it,
runs `pytest -m hostile` and renders the JSON it gets into markdown.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

TRACEBACK = "Traceback (most recent call last)"
REPORT_ENV = "VLMSERVE_HOSTILE_REPORT"

_results: dict[str, dict[str, Any]] = {}


def _tracebacks_in_files(tmp_path: Path | None) -> int:
    if tmp_path is None or not tmp_path.exists():
        return 0
    count = 0
    for log_file in tmp_path.rglob("*.log"):
        try:
            count += log_file.read_text(errors="replace").count(TRACEBACK)
        except OSError:
            continue
    return count


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    marker = item.get_closest_marker("hostile")
    if marker is None:
        return
    report: pytest.TestReport = outcome.get_result()
    entry = _results.setdefault(
        item.nodeid,
        {"case": marker.args[0] if marker.args else item.name, "test": item.nodeid, "outcome": "passed", "tracebacks": 0},
    )
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
    elif report.skipped and report.when != "teardown":
        entry["outcome"] = "skipped"
    if report.when == "teardown":
        # The teardown report carries every phase's captured sections ("Captured stderr call", …).
        # One traceback often shows twice (log capture and stderr): per phase, count the fullest.
        per_phase: dict[str, int] = {}
        for title, content in report.sections:
            phase = title.rsplit(" ", 1)[-1]
            per_phase[phase] = max(per_phase.get(phase, 0), content.count(TRACEBACK))
        entry["tracebacks"] += sum(per_phase.values())
        funcargs = getattr(item, "funcargs", {})
        entry["tracebacks"] += _tracebacks_in_files(funcargs.get("tmp_path"))
        for key, value in item.user_properties:
            if key in ("requests_lost", "requests_sent"):
                entry[key] = value


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(REPORT_ENV)
    if target:
        Path(target).write_text(json.dumps(sorted(_results.values(), key=lambda e: e["test"]), indent=1))


# ---- rendering (run by scripts/hostile-table) ------------------------------------------------

TABLE_START = "<!-- hostile-table:start -->"
TABLE_END = "<!-- hostile-table:end -->"


def render_markdown(entries: list[dict[str, Any]], command: str) -> str:
    """The table and its totals; requests lost shows '—' where a case sends no load."""
    lost_known = [e["requests_lost"] for e in entries if "requests_lost" in e]
    lines = [
        f"Produced by `{command}`: {len(entries)} cases, "
        f"{sum(e['outcome'] == 'passed' for e in entries)} held, "
        f"{sum(e['tracebacks'] for e in entries)} tracebacks in any log, "
        f"{sum(lost_known)} requests lost (of {sum(e.get('requests_sent', 0) for e in entries)} sent by the cases that send load).",
        "",
        "| case | outcome | tracebacks | requests lost | test |",
        "|---|---|---|---|---|",
    ]
    for entry in sorted(entries, key=lambda e: (e["test"].split("::")[0], e["case"])):
        lost = entry.get("requests_lost")
        lost_text = "—" if lost is None else f"{lost} of {entry.get('requests_sent', '?')}"
        test_file, _, test_name = entry["test"].partition("::")
        lines.append(
            f"| {entry['case']} | {entry['outcome']} | {entry['tracebacks']} | {lost_text} | `{test_file}` `{test_name}` |"
        )
    return "\n".join(lines)


def replace_table(page: str, table: str) -> str:
    """Put `table` between the markers of `page` (the rest of the page is hand-written)."""
    start, end = page.find(TABLE_START), page.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"error: the page has no {TABLE_START} … {TABLE_END} markers to put the table between")
    return page[: start + len(TABLE_START)] + "\n" + table + "\n" + page[end:]


if __name__ == "__main__":
    import sys

    results_path, page_path, command = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    entries = json.loads(Path(results_path).read_text())
    if not entries:
        raise SystemExit("error: no hostile cases ran: is the marker registered and `-m hostile` selecting tests?")
    page_path.write_text(replace_table(page_path.read_text(), render_markdown(entries, command)))
    failed = [e for e in entries if e["outcome"] not in ("passed", "skipped")]
    print(f"{len(entries)} hostile cases, {len(failed)} not held; table written to {page_path}")
    sys.exit(1 if failed else 0)
