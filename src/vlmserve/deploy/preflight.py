"""Checks that run before any process of a deployment starts.

A mistake found here costs a second, not a model load: the name is not already running
(or orphaned), the ports are free, the replicas fit in the memory free now, and the gateway
knows its routing policy. Each failure is one UserError line that says what to do next.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from vlmserve.deploy import processes
from vlmserve.deploy.state import read_state
from vlmserve.errors import UserError


def refuse_running_duplicate(name: str, state_file: Path) -> None:
    """One deployment per name: refuse while its supervisor runs, or while processes a
    killed supervisor left behind still run (their only record is this state file)."""
    previous = read_state(state_file)
    if previous is None or previous.supervisor_pid == os.getpid():
        return
    if previous.supervisor_alive():
        raise UserError(
            f"deployment '{name}' is already running (supervisor pid {previous.supervisor_pid}); "
            f"stop it with `vlmserve down {name}` or give this one another --name"
        )
    orphans = previous.living_members()
    if orphans:
        listed = ", ".join(f"{member.label} pid {member.pid}" for member in orphans)
        raise UserError(
            f"deployment '{name}' still has processes running from a supervisor that is gone "
            f"({listed}); stop them with `vlmserve down {name}`, then start it again"
        )


def check_ports(host: str, ports: list[int]) -> None:
    """Every port is free on host; else name who holds it."""
    for port in ports:
        if not processes.port_is_free(host, port):
            owners = processes.port_listeners(port)
            who = f" by {processes.describe_pid(owners[0])}" if owners else ""
            raise UserError(f"port {port} on {host} is already in use{who}; stop that process or choose another --port")


def check_free_memory(needed_gb: float, replicas: int) -> None:
    """Refuse to start when the replicas would not fit in the memory free now."""
    available_gb = psutil.virtual_memory().available / 1e9
    if needed_gb > available_gb:
        raise UserError(
            f"not enough free memory: {replicas} replica(s) need about {needed_gb:.1f} GB but "
            f"{available_gb:.1f} GB is available; lower --replicas or kv_cache_space_gb, or free memory"
        )


def check_gateway_policy(policy: str) -> None:
    """Refuse an unknown routing policy before any engine starts (not a minute later)."""
    from vlmserve.gateway.config import POLICY_NAMES

    if policy not in POLICY_NAMES:
        raise UserError(f"gateway_policy '{policy}' is unknown; choose one of {', '.join(POLICY_NAMES)}")
