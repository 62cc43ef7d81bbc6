"""The contract between an engine kind and whatever starts it.

An `EngineLauncher` says, for one DeploymentSpec, everything needed to run that engine's
replicas and nothing about how they are run: the command line (built here once, so
`vlmserve up`, `up --print-plan` and `export k8s` pass the very same flags), each
replica's environment and devices, the configuration a running replica must report (the
readiness check compares it with what the replica says), and the host memory the replicas
take (checked before anything starts). The supervisor and the Kubernetes export only ask;
vLLM (`engines.vllm.VllmLauncher`) and the simulated engine (`engines.sim.launcher.SimLauncher`)
answer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from vlmserve.spec import DeploymentSpec


@dataclass
class ExpectedConfig:
    """What the spec asks a running replica to serve; None means 'whatever the engine chose'."""

    served_model_name: str
    root: str | None = None
    max_model_len: int | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    expects_images: bool | None = True
    """True: the image generation must succeed. None: unknown model; an HTTP 400 to the image
    request means a text-only model and is accepted. False: skip the image check."""
    adapters: tuple[str, ...] = ()
    """LoRA adapters the replica must list in /v1/models and answer a 1-token generation with."""


@dataclass(frozen=True)
class EngineLaunch:
    """Everything needed to start one replica: argv, extra environment, and what it serves."""

    argv: list[str]
    env: dict[str, str]
    """Overrides laid over this process's environment (see full_env)."""
    served_model_name: str
    model: str
    port: int
    devices: str = ""
    notes: list[str] = field(default_factory=list)

    def full_env(self) -> dict[str, str]:
        """The process environment: ours plus this replica's overrides."""
        merged = dict(os.environ)
        merged.update(self.env)
        return merged


EventSink = Callable[[str], None]


class EngineLauncher(Protocol):
    """How one engine kind is started for one spec; vLLM and the sim engine implement it."""

    @property
    def spec(self) -> DeploymentSpec: ...

    @property
    def module(self) -> str:
        """The Python module run with `-m` (the program part of every argv)."""
        ...

    @property
    def model_path(self) -> str:
        """What the engine loads: a resolved directory, a hub id, or a simulated name."""
        ...

    @property
    def device_kind(self) -> str:
        """'cpu', 'gpu' or 'sim': the kind of device the replicas run on."""
        ...

    def arguments(self, *, host: str, port: int, index: int) -> list[str]:
        """The flags after the program, for replica `index` listening on host:port."""
        ...

    def launches(self) -> list[EngineLaunch]:
        """One launch per replica on this machine, at `spec.replica_host` and `spec.replica_ports()`."""
        ...

    def expected(self) -> ExpectedConfig:
        """The configuration every ready replica must report."""
        ...

    def host_memory_needed_gb(self) -> float:
        """Host memory all replicas take together, for the check before anything starts."""
        ...


def program(module: str) -> list[str]:
    """`python -m module` with this interpreter: the program part of a local argv."""
    return [sys.executable, "-m", module]


def served_model_name(spec: DeploymentSpec) -> str:
    """The name clients send: explicit, else the model as given (so 'embedded' for the tiny model)."""
    if spec.engine_args.served_model_name:
        return spec.engine_args.served_model_name
    return spec.model


def make_launcher(
    spec: DeploymentSpec, *, model_path: str | None = None, device_kind: str | None = None, on_event: EventSink | None = None
) -> EngineLauncher:
    """The launcher for `spec.engine`: the one place that picks an engine kind.

    model_path / device_kind: as given (the Kubernetes export passes the pod's view), else
    resolved on this machine (the model is made or checked, the devices detected)."""
    if spec.engine == "sim":
        from vlmserve.engines.sim.launcher import SimLauncher

        return SimLauncher(spec)
    from vlmserve.engines.vllm import VllmLauncher
    from vlmserve.recipes.apply import spec_with_recipe

    if model_path is not None and device_kind is not None:  # the model's recipe, as `up` would apply it
        return VllmLauncher(spec_with_recipe(spec, model_path, on_event, elsewhere=True), model_path, device_kind)  # type: ignore[arg-type]
    return VllmLauncher.on_this_machine(spec, on_event=on_event)
