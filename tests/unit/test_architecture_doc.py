"""docs/architecture.md names only what exists, and names every package: a newcomer's map that
drifts from the tree is worse than none."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "vlmserve"
DOC = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`([A-Za-z0-9_./-]+(?:\.py|/))`")
"""A module (`x.py`) or a folder (`x/`) named in backticks; bare words are prose."""


def _exists(name: str) -> bool:
    """Relative to the repository, to the package, or (for `tokens.py` in the vision row) a file or
    folder somewhere in the package with that trailing path."""
    stripped = name.rstrip("/")
    if (ROOT / stripped).exists() or (PACKAGE / stripped).exists():
        return True
    return any(str(path).endswith("/" + stripped) for path in PACKAGE.rglob("*"))


def test_every_module_and_folder_the_doc_names_exists() -> None:
    named = set(NAMED.findall(DOC.read_text()))
    assert len(named) > 20  # the pattern still finds the layer table
    missing = sorted(name for name in named if not _exists(name))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_layer_table_names_every_package_and_top_level_module() -> None:
    text = DOC.read_text()
    packages = {path.name + "/" for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    modules = {path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py")}
    unnamed = sorted(name for name in packages | modules if f"`{name}`" not in text)
    assert not unnamed, f"docs/architecture.md leaves out: {unnamed}"
