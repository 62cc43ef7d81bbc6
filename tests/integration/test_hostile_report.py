"""The plugin behind docs/security.md's table counts what it claims to count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT  # noqa: E402
from tests.hostile_report import TABLE_END, TABLE_START, render_markdown, replace_table


def test_counts_tracebacks_in_logs_and_requests_lost(tmp_path: Path) -> None:
    case_dir = tmp_path / "cases"
    case_dir.mkdir()
    (case_dir / "test_cases.py").write_text(
        textwrap.dedent("""
        import logging
        import pytest

        @pytest.mark.hostile("a case that logs a traceback to a file")
        def test_file_traceback(tmp_path, record_property):
            (tmp_path / "server.log").write_text("Traceback (most recent call last):\\n  boom\\n")
            record_property("requests_sent", 10)
            record_property("requests_lost", 1)

        @pytest.mark.hostile("a case that logs an exception")
        def test_logged_exception():
            try:
                raise ValueError("x")
            except ValueError:
                logging.getLogger("t").exception("failed")

        @pytest.mark.hostile("a case that fails")
        def test_fails():
            assert False

        def test_not_hostile():
            pass
    """)
    )
    results = tmp_path / "results.json"
    env = {**os.environ, "VLMSERVE_HOSTILE_REPORT": str(results), "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.hostile_report",
            "-p",
            "no:cacheprovider",
            "-m",
            "hostile",
            str(case_dir / "test_cases.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    entries = {e["case"]: e for e in json.loads(results.read_text())}
    assert set(entries) == {"a case that logs a traceback to a file", "a case that logs an exception", "a case that fails"}
    assert entries["a case that logs a traceback to a file"]["tracebacks"] == 1
    assert entries["a case that logs a traceback to a file"]["requests_lost"] == 1
    assert entries["a case that logs an exception"]["tracebacks"] == 1
    assert entries["a case that fails"]["outcome"] == "failed"

    table = render_markdown(list(entries.values()), "scripts/hostile-table")
    assert "3 cases, 2 held, 2 tracebacks in any log, 1 requests lost (of 10 sent" in table
    assert "| 1 of 10 |" in table


def test_replace_table_keeps_the_hand_written_page() -> None:
    page = f"# Security\n\nintro\n\n{TABLE_START}\nold\n{TABLE_END}\n\nafter\n"
    new = replace_table(page, "NEW")
    assert new == f"# Security\n\nintro\n\n{TABLE_START}\nNEW\n{TABLE_END}\n\nafter\n"
    with pytest.raises(SystemExit, match="no <!-- hostile-table:start -->"):
        replace_table("# no markers", "NEW")
