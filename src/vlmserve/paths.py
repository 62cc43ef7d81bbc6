"""Every directory vlmserve writes, decided in one place.

Two roots, each with one rule (the XDG Base Directory convention, with an override):

- Data (run history, deployment state, sweeps): `$VLMSERVE_HOME`, else
  `$XDG_DATA_HOME/vlmserve`, else `~/.local/share/vlmserve`. Losing it loses history.
- Cache (the embedded tiny model, anything vlmserve can make again): `$VLMSERVE_CACHE`,
  else `$XDG_CACHE_HOME/vlmserve`, else `~/.cache/vlmserve`. Deleting it costs only time.

An empty variable counts as unset. Paths are computed on every call, never stored, so a
test (or a benchmark) that sets `VLMSERVE_HOME` for one run sees every writer move with it.
The layout under the data root:

    <home>/runs.duckdb              the run store (vlmserve.results.store)
    <home>/records/<run_id>.parquet every request of each stored run
    <home>/deployments/<name>/      state.json, supervisor.log, logs/ of one deployment
    <home>/sweeps/<name>/           a sweep's manifest, results and report
    <home>/tunes/<name>/            a tune's store, candidates' logs, result, recommended spec, report
"""

from __future__ import annotations

import os
from pathlib import Path


def _root(override: str, xdg: str, xdg_default: Path) -> Path:
    """override, else <xdg>/vlmserve, else <xdg_default>/vlmserve (empty values count as unset)."""
    explicit = os.environ.get(override)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get(xdg)
    return (Path(base).expanduser() if base else xdg_default) / "vlmserve"


def home_dir() -> Path:
    """The data root: $VLMSERVE_HOME, else $XDG_DATA_HOME/vlmserve, else ~/.local/share/vlmserve."""
    return _root("VLMSERVE_HOME", "XDG_DATA_HOME", Path.home() / ".local" / "share")


def cache_dir() -> Path:
    """The cache root: $VLMSERVE_CACHE, else $XDG_CACHE_HOME/vlmserve, else ~/.cache/vlmserve."""
    return _root("VLMSERVE_CACHE", "XDG_CACHE_HOME", Path.home() / ".cache")


def runs_database() -> Path:
    """The DuckDB file holding every stored run's summary."""
    return home_dir() / "runs.duckdb"


def records_dir() -> Path:
    """Where each stored run's per-request records (Parquet) go."""
    return home_dir() / "records"


def deployments_dir() -> Path:
    """One directory per deployment `vlmserve up` started (what `status` and `down` list)."""
    return home_dir() / "deployments"


def deployment_dir(name: str) -> Path:
    """state.json, supervisor.log and logs/ of the deployment called `name`."""
    return deployments_dir() / name


def sweep_dir(name: str) -> Path:
    """The default directory of the sweep called `name`, beside the run store."""
    return home_dir() / "sweeps" / name


def tune_dir(name: str) -> Path:
    """The default directory of a tune of the deployment called `name`."""
    return home_dir() / "tunes" / name
