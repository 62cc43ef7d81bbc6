"""How `vlmserve up --engine sim` and `export k8s` start the simulated engine: one command line.

Each replica is `python -m vlmserve engine sim` with the spec's serving limits (the same
vLLM flag names the real engine takes), the sim options from the spec's `sim:` section and
a seed per replica (replicas differ in their generated text and lengths, as real ones do).
The flag names are those of `SimEngineConfig`'s fields, which `vlmserve engine sim` maps
one-to-one, so a renamed field fails here, at import, not at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from vlmserve.engines.launcher import EngineLaunch, ExpectedConfig, program, served_model_name
from vlmserve.engines.sim.options import SimEngineConfig
from vlmserve.engines.sim.rehearsal import RehearsalOptimum
from vlmserve.spec import DeploymentSpec

SIM_ENGINE_HOST_GB = 0.3
"""Host memory one sim engine process takes (Python, the server, the scheduler model)."""

VLMSERVE_MODULE = "vlmserve"

_SPEC_FLAGS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "profile", "ttft_ms", "itl_ms", "cold_start_s")
"""SimEngineConfig fields a DeploymentSpec sets, in the order they are passed."""

_VLLM_FLAGS = ("api_server_count",)
"""vLLM flags in a spec's engine_args that the sim models with the same meaning (its frontend
stage): passed on under the same name, so a sim rehearsal of a spec keeps its API server count."""

_unknown = (set(_SPEC_FLAGS) | set(_VLLM_FLAGS)) - {each.name for each in fields(SimEngineConfig)}
assert not _unknown, f"SimEngineConfig has no field(s) {_unknown}"


def _flag(field_name: str) -> str:
    """SimEngineConfig field -> its `vlmserve engine sim` flag (max_model_len -> --max-model-len)."""
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class SimLauncher:
    """The simulated engine's answers to the EngineLauncher questions."""

    spec: DeploymentSpec
    module: str = VLMSERVE_MODULE
    device_kind: str = "sim"

    @property
    def model_path(self) -> str:
        return self.spec.model

    def arguments(self, *, host: str, port: int, index: int) -> list[str]:
        """`engine sim` and its flags; replica `index` is seeded with its index."""
        spec = self.spec
        argv = ["engine", "sim", "--host", host, "--port", str(port), "--model", served_model_name(spec),
                "--seed", str(index)]  # fmt: skip
        values = {
            "max_model_len": spec.engine_args.max_model_len,
            "max_num_seqs": spec.engine_args.max_num_seqs,
            "max_num_batched_tokens": spec.engine_args.max_num_batched_tokens,
            "profile": spec.sim.profile,
            "ttft_ms": spec.sim.ttft_ms,
            "itl_ms": spec.sim.itl_ms,
            "cold_start_s": spec.sim.cold_start_s,
        }
        for name in _SPEC_FLAGS:
            if values[name] is not None:
                argv += [_flag(name), str(values[name])]
        vllm_flags = spec.engine_args.vllm_flags()
        for name in _VLLM_FLAGS:
            if vllm_flags.get(name) is not None:
                argv += [_flag(name), str(vllm_flags[name])]
        for name in spec.lora_modules:
            argv += ["--lora-module", name]
        for flag, value in (("--max-loras", spec.max_loras), ("--max-cpu-loras", spec.max_cpu_loras)):
            if value is not None:
                argv += [flag, str(value)]
        if spec.sim.rehearsal_optimum:
            optimum = RehearsalOptimum.parse(
                ",".join(f"{key}={value:g}" for key, value in spec.sim.rehearsal_optimum.items()), spec.sim.rehearsal_penalty
            )
            argv += ["--rehearsal-optimum", optimum.as_flag(), "--rehearsal-penalty", f"{optimum.penalty:g}"]
        return argv + list(spec.sim.extra_args)

    def engine_config(self, index: int = 0) -> SimEngineConfig:
        """What replica `index` runs with, from the spec alone (the free-form `sim.extra_args` are not
        read): the same values `arguments` passes, for the planner side of `vlmserve tune`."""
        spec = self.spec
        args = spec.engine_args
        values: dict[str, Any] = {
            "max_model_len": args.max_model_len,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "profile": spec.sim.profile,
            "ttft_ms": spec.sim.ttft_ms,
            "itl_ms": spec.sim.itl_ms,
            "api_server_count": args.vllm_flags().get("api_server_count"),
        }
        config = SimEngineConfig(
            model=served_model_name(spec), seed=index, **{name: value for name, value in values.items() if value is not None}
        )
        if spec.sim.rehearsal_optimum:
            config.rehearsal_optimum = ",".join(f"{key}={value:g}" for key, value in spec.sim.rehearsal_optimum.items())
            config.rehearsal_penalty = spec.sim.rehearsal_penalty
        return config

    def launches(self) -> list[EngineLaunch]:
        env = {"PYTHONUNBUFFERED": "1", **self.spec.env}
        return [
            EngineLaunch(
                argv=program(self.module) + self.arguments(host=self.spec.replica_host, port=port, index=index),
                env=env,
                served_model_name=served_model_name(self.spec),
                model=self.spec.model,
                port=port,
                devices="sim",
            )
            for index, port in enumerate(self.spec.replica_ports())
        ]

    def expected(self) -> ExpectedConfig:
        return ExpectedConfig(
            served_model_name=served_model_name(self.spec),
            max_model_len=self.spec.engine_args.max_model_len,
            expects_images=None,
            adapters=tuple(self.spec.lora_modules),
        )

    def host_memory_needed_gb(self) -> float:
        return SIM_ENGINE_HOST_GB * self.spec.replicas
