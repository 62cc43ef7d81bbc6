"""`up --engine sim` passes vLLM's --api-server-count from engine_args to the sim's frontend stage.

Integration tier: a spec's extra engine_args are checked against the installed vLLM's parser,
which runs in a subprocess.
"""

from __future__ import annotations

from pathlib import Path

from vlmserve.deploy.plan import replica_plans
from vlmserve.engines.launcher import make_launcher
from vlmserve.spec import DeploymentSpec


def test_sim_takes_vllms_api_server_count_from_engine_args(tmp_path: Path) -> None:
    spec = DeploymentSpec.model_validate({
        "name": "front", "engine": "sim", "model": "sim-model", "replicas": 1, "port": 9000,
        "engine_args": {"api_server_count": 2},
    })  # fmt: skip
    plans, _notes = replica_plans(make_launcher(spec), tmp_path / "logs")
    argv = plans[0].argv
    assert argv[argv.index("--api-server-count") + 1] == "2"
