"""`vlmserve engine sim --model M --gpu G --tp N`: the sim engine timed by the planner's roofline."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from tests.helpers.sim import start_sim_engine
from vlmserve.engines.sim.options import SimEngineConfig, build_engine_core
from vlmserve.errors import UserError
from vlmserve.hardware.cost import RooflineStepCost
from vlmserve.hardware.roofline import make_step_cost_model


def test_gpu_mode_builds_a_roofline_scheduler_with_planned_kv_blocks() -> None:
    config = SimEngineConfig(model="gemma-4-31b", gpu="h100", tp=2, max_model_len=8192)
    config.validate()
    core = build_engine_core(config)
    assert isinstance(core.cost, RooflineStepCost) and core.cost.tp == 2
    # the KV pool comes from memory left after weights, not the --num-kv-blocks default
    assert core.config.num_kv_blocks != SimEngineConfig().num_kv_blocks
    assert core.config.num_kv_blocks > 1000


def test_gpu_mode_errors() -> None:
    with pytest.raises(UserError, match="--profile and --gpu exclude each other"):
        make_step_cost_model("h100-8b", model="llama-3.1-8b", gpu="h100")
    with pytest.raises(UserError, match="unknown model 'sim-model'"):
        SimEngineConfig(model="sim-model", gpu="h100").validate()
    with pytest.raises(UserError, match="does not fit on 1× L4"):
        SimEngineConfig(model="gemma-4-31b", gpu="l4").validate()


def test_sim_engine_serves_in_gpu_mode(vlmserve_cmd: list[str]) -> None:
    with start_sim_engine(model="llama-3.1-8b", gpu="h100", tp=1) as engine:
        response = httpx.post(
            f"{engine.base_url}/v1/completions",
            json={"model": "llama-3.1-8b", "prompt": "hello there", "max_tokens": 8},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 8
    done = subprocess.run(
        [*vlmserve_cmd, "engine", "sim", "--model", "llama-3.1-8b", "--gpu", "v100", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown GPU 'v100'" in done.stderr
