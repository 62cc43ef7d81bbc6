"""The one rule for where vlmserve writes: override, else XDG, else the XDG default."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmserve import paths
from vlmserve.deploy.state import state_path
from vlmserve.engines.embedded import TINY_MODEL_DIRNAME, tiny_model_path
from vlmserve.report.source import default_sweep_dir
from vlmserve.results import store

VARIABLES = ("VLMSERVE_HOME", "XDG_DATA_HOME", "VLMSERVE_CACHE", "XDG_CACHE_HOME")


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return tmp_path / "user"


def test_data_root_override_then_xdg_then_default(fake_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert paths.home_dir() == fake_home / ".local" / "share" / "vlmserve"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert paths.home_dir() == tmp_path / "xdg" / "vlmserve"
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "explicit"))
    assert paths.home_dir() == tmp_path / "explicit"
    monkeypatch.setenv("VLMSERVE_HOME", "")  # empty counts as unset
    assert paths.home_dir() == tmp_path / "xdg" / "vlmserve"


def test_cache_root_override_then_xdg_then_default(fake_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert paths.cache_dir() == fake_home / ".cache" / "vlmserve"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    assert paths.cache_dir() == tmp_path / "xdg-cache" / "vlmserve"
    monkeypatch.setenv("VLMSERVE_CACHE", "~/cache")
    assert paths.cache_dir() == fake_home / "cache"
    assert tiny_model_path() == fake_home / "cache" / TINY_MODEL_DIRNAME


def test_every_writer_agrees_on_the_data_root(fake_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run store and the deployment state used to disagree about XDG_DATA_HOME; no more."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "xdg" / "vlmserve"
    assert store.home_dir() == root
    assert store.database_path() == root / "runs.duckdb"
    assert store.records_dir() == root / "records"
    assert state_path("web") == root / "deployments" / "web" / "state.json"
    assert default_sweep_dir("s1") == root / "sweeps" / "s1"
