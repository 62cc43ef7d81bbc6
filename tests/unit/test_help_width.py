"""`--help` of every verb shows every flag name whole at 80 columns (vLLM's long alias names included)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from vlmserve.cli.app import build_app


def _commands() -> list[tuple[list[str], Any]]:
    """(argv path, command) for every command and group under the root, the root included."""
    found: list[tuple[list[str], Any]] = []

    def walk(path: list[str], command: Any) -> None:
        found.append((path, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):  # a group (typer may vendor click)
            walk([*path, name], sub)

    walk([], typer.main.get_command(build_app()))
    return found


@pytest.mark.parametrize("path, command", [pytest.param(p, c, id=" ".join(p) or "vlmserve") for p, c in _commands()])
def test_help_shows_every_flag_whole_at_80_columns(path: list[str], command: Any) -> None:
    result = CliRunner().invoke(build_app(), [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    for param in command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.output), f"{name} cut:\n{result.output}"
