"""Waiting for one started process to be ready, and making sure it is the one we started.

A replica is ready when the readiness checks pass (vlmserve.deploy.readiness) *and* the port
is answered by the process tree vlmserve started *and* what it serves matches what its
launcher expects; the gateway is ready when /health answers. Every way this can fail ends
in one UserError that says what failed and where the log is; a stop asked for meanwhile
ends in ReadinessAborted, which is not a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vlmserve.deploy import processes
from vlmserve.deploy.members import ManagedProcess
from vlmserve.deploy.readiness import ReadinessAborted, ServedConfig, StaleReplica, config_mismatches, wait_until_ready
from vlmserve.errors import UserError

HEALTH_POLL_S = 0.2
"""Between the gateway's /health polls (see readiness.READY_POLL_S)."""


def await_ready(
    member: ManagedProcess, timeout_s: float, keep_waiting: Callable[[], bool], stopping: Callable[[], bool]
) -> ServedConfig | None:
    """Wait until the started `member` is ready and verified; return what it serves (None: gateway).

    keep_waiting: False once the process died or a stop was asked for; stopping: True when
    it was a stop (then ReadinessAborted propagates instead of a start-up failure)."""
    plan = member.plan
    try:
        if plan.expected is None:
            served = None
            wait_for_health(plan.url, timeout_s, keep_waiting)
        else:
            served = wait_until_ready(plan.url, plan.expected, timeout_s=timeout_s, keep_waiting=keep_waiting)
        verify_owner(member)
        if served is not None and plan.expected is not None:
            problems = config_mismatches(served, plan.expected)
            if problems:
                raise StaleReplica("; ".join(problems))
    except ReadinessAborted:
        if stopping():
            raise
        raise UserError(start_failure_message(member)) from None
    except TimeoutError as last_problem:
        raise UserError(
            f"{plan.label} did not become ready within {timeout_s:.0f} s "
            f"(last check: {last_problem}); see its log {plan.log_path}"
        ) from None
    except StaleReplica as problem:
        raise UserError(
            f"{plan.label} on port {plan.port} serves another configuration ({problem}); a stale engine may "
            f"hold the port: stop it and retry"
        ) from None
    return served


def wait_for_health(url: str, timeout_s: float, keep_waiting: Callable[[], bool]) -> None:
    """Readiness for the gateway: GET /health is 200."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        if not keep_waiting():
            raise ReadinessAborted(last)
        try:
            # our own gateway, maybe with a self-signed certificate: the check is "it answers"
            reply = httpx.get(f"{url}/health", timeout=5, trust_env=False, verify=False)  # noqa: S501
            if reply.status_code == 200:
                return
            last = f"/health answered {reply.status_code}"
        except httpx.TransportError as problem:
            last = f"{type(problem).__name__}"
        if time.monotonic() >= deadline:
            raise TimeoutError(last)
        time.sleep(HEALTH_POLL_S)


def verify_owner(member: ManagedProcess) -> None:
    """The port must be answered by the process tree we started, not by a leftover."""
    assert member.process is not None
    listeners = processes.port_listeners(member.plan.port)
    if not listeners:
        return  # the OS would not tell us; the configuration check still runs
    ours = set(processes.tree_pids(member.process.pid))
    strangers = [pid for pid in listeners if pid not in ours]
    if strangers and not ours.intersection(listeners):
        raise StaleReplica(
            f"port {member.plan.port} is answered by {processes.describe_pid(strangers[0])}, not by the engine vlmserve started"
        )


def start_failure_message(member: ManagedProcess) -> str:
    """One line that says what failed and where the log is, then the log's last lines."""
    assert member.process is not None
    code = member.process.poll()
    tail = processes.log_tail(member.plan.log_path, lines=12)
    telling = next((line for line in reversed(tail) if "Error" in line or "error:" in line.lower()), tail[-1] if tail else "")
    what = f"{member.plan.label} engine" if member.plan.role == "replica" else member.plan.label
    summary = f"{what} exited with code {code} during start-up: {telling.strip()[:300]} (full log: {member.plan.log_path})"
    if tail:
        summary += "\n  last lines of the log:\n" + "\n".join(f"    {line[:300]}" for line in tail)
    return summary
