"""Running `vlmserve` in-process in a test: its exit code and what it printed."""

from __future__ import annotations

import pytest

from vlmserve.cli.app import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `vlmserve ARGV`, run in this process (no subprocess)."""
    with pytest.raises(SystemExit) as done:
        main(argv)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err
