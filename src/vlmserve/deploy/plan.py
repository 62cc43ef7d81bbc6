"""What a deployment runs, as process plans: the engine launcher's replicas, then the gateway.

Pure: nothing here starts, checks or waits, so `up --print-plan`, the supervisor and the
tests all see the same argv for the same spec. Every replica's command line comes from the
spec's `EngineLauncher` (vlmserve.engines.launcher); the gateway's from `front_door`.
"""

from __future__ import annotations

import os
from pathlib import Path

from vlmserve.deploy.front_door import gateway_argv, gateway_env
from vlmserve.deploy.members import ProcessPlan
from vlmserve.engines.launcher import EngineLauncher
from vlmserve.spec import DeploymentSpec


def replica_plans(launcher: EngineLauncher, log_dir: Path) -> tuple[list[ProcessPlan], list[str]]:
    """One plan per replica, in index order, each with its own port, devices and log; and the
    launcher's notes about the placement (said once, when the deployment starts)."""
    expected = launcher.expected()
    launches = launcher.launches()
    plans = [
        ProcessPlan(
            role="replica",
            index=index,
            argv=launch.argv,
            env=launch.full_env(),
            host=launcher.spec.replica_host,
            port=launch.port,
            log_path=log_dir / f"replica-{index}.log",
            expected=expected,
            devices=launch.devices,
        )
        for index, launch in enumerate(launches)
    ]
    return plans, list(launches[0].notes) if launches else []


def gateway_plan(
    spec: DeploymentSpec,
    replica_urls: list[str],
    log_dir: Path,
    model_dir: str | None = None,
    discover_interval_s: float | None = None,
) -> ProcessPlan:
    """The gateway in front of the replicas at `replica_urls` (serving the model at `model_dir`);
    `discover_interval_s`: how often it rereads spec.gateway_discover (None: its default)."""
    argv = gateway_argv(spec, replica_urls, model_dir)
    if discover_interval_s is not None:
        argv += ["--discover-interval", f"{discover_interval_s:g}"]
    return ProcessPlan(
        role="gateway",
        index=0,
        argv=argv,
        env=gateway_env(spec, {**os.environ, "PYTHONUNBUFFERED": "1"}),
        host=spec.host,
        port=spec.port,
        log_path=log_dir / "gateway.log",
        expected=None,
        scheme="https" if spec.ssl_certfile else "http",
    )
