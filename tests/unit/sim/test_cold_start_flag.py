"""The spec's `sim.cold_start_s` reaches each sim replica as `engine sim --cold-start-s`."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

from vlmserve.cli.engine import sim
from vlmserve.engines.launcher import make_launcher
from vlmserve.spec import DeploymentSpec


def test_spec_cold_start_becomes_the_engine_flag() -> None:
    spec = DeploymentSpec.model_validate({"engine": "sim", "replicas": 2, "sim": {"ttft_ms": 5, "cold_start_s": 20}})
    for launch in make_launcher(spec).launches():
        assert launch.argv[launch.argv.index("--cold-start-s") + 1] == "20.0"
    assert "cold_start_s" in inspect.signature(sim).parameters  # the flag the launcher writes exists


def test_no_cold_start_no_flag() -> None:
    spec = DeploymentSpec.model_validate({"engine": "sim", "sim": {"ttft_ms": 5}})
    assert "--cold-start-s" not in make_launcher(spec).launches()[0].argv


@pytest.mark.hostile("a deployment spec with a negative or infinite sim cold start")
@pytest.mark.parametrize("value", [-1, float("inf")])
def test_bad_cold_start_in_spec_is_refused(value: float) -> None:
    with pytest.raises(ValidationError, match="cold_start_s"):
        DeploymentSpec.model_validate({"engine": "sim", "sim": {"cold_start_s": value}})
