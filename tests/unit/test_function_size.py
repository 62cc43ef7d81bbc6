"""No function in src/ is over 80 lines (issue #43): ruff counts statements and branches, not
lines, so this keeps the bound a newcomer reads a function by."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 80


def _long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_src_is_over_80_lines() -> None:
    assert not _long_functions(SRC, MAX_LINES)


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * 81)
    assert _long_functions(tmp_path, MAX_LINES) == ["long.py:1 f (82 lines)"]
