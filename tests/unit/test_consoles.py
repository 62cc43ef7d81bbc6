"""Output redirected to a file or a pipe: a long line (a path, a URL) stays one line, for grep."""

from __future__ import annotations

import io

import pytest

from vlmserve.cli import consoles


def test_a_redirected_console_never_wraps_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()  # not a terminal, as a file or a pipe
    monkeypatch.setattr("sys.stdout", out)
    console = consoles.console(highlight=False)
    path = "/var/lib/vlmserve/deployments/clinic/logs/replica-0-" + "x" * 150 + ".log"
    console.print(f"replica 0 ready in 41 s, log {path}")
    assert out.getvalue() == f"replica 0 ready in 41 s, log {path}\n"
    assert console.width == consoles.PIPED_WIDTH  # tables keep their columns


def test_stderr_follows_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    consoles.console(stderr=True).print("w" * 300)
    assert err.getvalue() == "w" * 300 + "\n"
