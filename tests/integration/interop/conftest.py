"""The import tests' run history, shared by the files of this folder (a fixture imported by name
into a test module shadows itself in every test that takes it)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"
