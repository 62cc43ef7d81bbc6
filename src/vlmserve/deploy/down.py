"""`vlmserve down`: stop a deployment from outside the process that runs it.

A live supervisor is asked (SIGTERM) and owns the clean-up; it stops its own members. A
supervisor that was killed outright leaves its engines behind, recorded only in state.json:
those are found by pid *and* start time (never a stranger that reused a pid), their process
trees stopped, and the state marked stopped so `status` stops calling them orphans.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from vlmserve import paths
from vlmserve.deploy.processes import stop_process_tree
from vlmserve.deploy.state import read_state, state_path, write_state
from vlmserve.errors import UserError

SUPERVISOR_POLL_S = 0.5


def stop_deployment(name: str, timeout_s: float, say: Callable[[str], None]) -> None:
    """Stop the deployment `name`; `say` hears each step (the CLI prints it)."""
    path = state_path(name)
    state = read_state(path)
    if state is None:
        raise UserError(f"no deployment named '{name}' under {paths.home_dir()}; see `vlmserve status`")
    if state.supervisor_alive():
        pid = int(state.supervisor_pid)  # type: ignore[arg-type]
        say(f"asking the supervisor (pid {pid}) to stop '{name}'")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while state.supervisor_alive() and time.monotonic() < deadline:
            time.sleep(SUPERVISOR_POLL_S)
        if state.supervisor_alive():
            raise UserError(f"the supervisor (pid {pid}) did not stop within {timeout_s:.0f} s; try again or kill it")
        say(f"'{name}' stopped")
        return
    leftovers = state.living_members()
    for member in leftovers:
        say(f"stopping leftover {member.role} {member.index} (pid {member.pid}, port {member.port})")
        stop_process_tree(int(member.pid))  # type: ignore[arg-type]
    state.mark_stopped()
    try:
        write_state(path, state)
    except OSError as problem:  # a full disk: the processes are stopped all the same; say what is stale
        say(
            f"could not mark '{name}' stopped in {path} ({problem}); `status` shows its members as "
            "stopped (supervisor gone) all the same"
        )
    say(f"'{name}' stopped ({len(leftovers)} leftover process group(s) cleaned up)")
