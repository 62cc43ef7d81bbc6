"""Where a running deployment writes down its state, and how `vlmserve status` reads it.

`$VLMSERVE_HOME/deployments/<name>/state.json` holds the supervisor's pid and each
process's pid, port, state, restarts and start time. It is rewritten atomically on every
change, so `status` (another process) never reads half a file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil


def vlmserve_home() -> Path:
    """$VLMSERVE_HOME, else ~/.local/share/vlmserve (also where run history lives)."""
    explicit = os.environ.get("VLMSERVE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "vlmserve"


def deployment_dir(name: str) -> Path:
    return vlmserve_home() / "deployments" / name


def state_path(name: str) -> Path:
    return deployment_dir(name) / "state.json"


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically replace a deployment's state file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    """The state in a state.json, or None when there is none (or it is unreadable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def list_deployments() -> list[str]:
    root = vlmserve_home() / "deployments"
    if not root.is_dir():
        return []
    return sorted(item.name for item in root.iterdir() if (item / "state.json").is_file())


def supervisor_alive(state: dict[str, Any]) -> bool:
    """True when the supervisor that wrote the state is still running."""
    pid = state.get("supervisor_pid")
    if not pid:
        return False
    try:
        process = psutil.Process(int(pid))
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE and (
            abs(process.create_time() - float(state.get("supervisor_started_at", 0))) < 2.0
        )
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def format_uptime(started_at: float | None, now: float | None = None) -> str:
    """'1h02m', '3m05s', '12s', or '-' when not running."""
    if not started_at:
        return "-"
    seconds = int((now or time.time()) - started_at)
    if seconds >= 3600:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
