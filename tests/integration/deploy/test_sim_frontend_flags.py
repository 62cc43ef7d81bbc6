"""`up --engine sim` passes vLLM's frontend flags from engine_args to the sim's frontend stage.

Integration tier: a spec's extra engine_args are checked against the installed vLLM's parser,
which runs in a subprocess.
"""

from __future__ import annotations

from pathlib import Path

from vlmserve.deploy.plan import replica_plans
from vlmserve.engines.launcher import make_launcher
from vlmserve.spec import DeploymentSpec


def test_sim_takes_vllms_frontend_flags_from_engine_args(tmp_path: Path) -> None:
    """`api_server_count` and `mm_processor_cache_gb` mean the same to the sim's frontend stage as to vLLM."""
    spec = DeploymentSpec.model_validate({
        "name": "front", "engine": "sim", "model": "sim-model", "replicas": 1, "port": 9000,
        "engine_args": {"api_server_count": 2, "mm_processor_cache_gb": 1.5},
    })  # fmt: skip
    plans, _notes = replica_plans(make_launcher(spec), tmp_path / "logs")
    argv = plans[0].argv
    assert argv[argv.index("--api-server-count") + 1] == "2"
    assert argv[argv.index("--mm-processor-cache-gb") + 1] == "1.5"
