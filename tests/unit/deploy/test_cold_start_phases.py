"""A cold start's phases from the engine's own log lines (vLLM 0.32's, and the sim's in its words)."""

from __future__ import annotations

import time
from pathlib import Path

from vlmserve.deploy.cold_start import cold_start_phases

VLLM_LOG = """=== vlmserve: starting replica 1 at 2026-11-29 10:27:20: python -m vllm.entrypoints.openai.api_server ...
(Worker pid=5459) INFO 11-29 10:28:03 [base_loader.py:82] Initializing model took 0.187531 seconds
(Worker pid=5459) INFO 11-29 10:28:03 [default_loader.py:501] Loading weights took 0.02 seconds
(EngineCore pid=5429) INFO 11-29 10:28:05 [core.py:402] init engine (profile, create kv cache, warmup model) took 1.02 s
(APIServer pid=5405) INFO 11-29 10:28:07 [entry.py:140] Starting vLLM server on http://127.0.0.1:28836
"""


def at(stamp: str) -> float:
    return time.mktime(time.strptime(f"2026-{stamp}", "%Y-%m-%d %H:%M:%S"))


def test_vllm_phases_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "replica-1.log"
    earlier = "=== vlmserve: starting replica 1 at ...\n(Worker pid=1) INFO 11-28 09:00:00 [default_loader.py:501] Loading weights took 9.00 seconds\n"
    log.write_text(earlier + VLLM_LOG)
    phases = cold_start_phases(log, len(earlier), at("11-29 10:27:20"), at("11-29 10:28:09"))
    assert phases == {
        "start_to_ready_s": 49.0,
        "weights_read_s": 0.02,
        "engine_init_s": 1.02,
        "start_to_weights_s": 43.0,
        "weights_to_engine_s": 2.0,
        "engine_to_listening_s": 2.0,
        "listening_to_ready_s": 2.0,
    }


def test_sim_lines_read_alike(tmp_path: Path) -> None:
    log = tmp_path / "replica-2.log"
    log.write_text(
        "INFO 11-29 11:00:12 [sim] Model loading took 0.00 GiB memory and 12.000000 seconds\n"
        "INFO 11-29 11:00:20 [sim] init engine (profile, create kv cache, warmup model) took 8.00 s\n"
    )
    phases = cold_start_phases(log, 0, at("11-29 11:00:00"), at("11-29 11:00:21"))
    assert phases["start_to_weights_s"] == 12.0 and phases["weights_to_engine_s"] == 8.0
    assert phases["engine_to_ready_s"] == 1.0 and phases["weights_read_s"] == 12.0


def test_a_log_without_phase_lines_gives_start_to_ready_only(tmp_path: Path) -> None:
    log = tmp_path / "replica-3.log"
    log.write_text("something else\n")
    assert cold_start_phases(log, 0, 100.0, 130.5) == {"start_to_ready_s": 30.5}
    assert cold_start_phases(tmp_path / "missing.log", 0, 100.0, 101.0) == {"start_to_ready_s": 1.0}


def test_status_shows_the_last_start_and_its_phases() -> None:
    from rich.console import Console

    from vlmserve.cli.up import describe_cold_start, status_table
    from vlmserve.deploy.state import DeploymentState, MemberRecord

    phases = {"start_to_ready_s": 49.0, "start_to_weights_s": 43.0, "weights_to_engine_s": 2.0, "engine_to_listening_s": 2.0}
    assert describe_cold_start(phases) == "49 s (weights 43, engine 2, listening 2)"
    assert describe_cold_start({"start_to_ready_s": 3.2}) == "3 s" and describe_cold_start(None) == ""
    state = DeploymentState(
        name="d",
        replicas=[
            MemberRecord(role="replica", port=9001, state="ready", cold_start=phases),
            MemberRecord(role="replica", index=1, port=9002, state="standby"),
        ],
        autoscale={
            "rule": {"min_replicas": 1, "max_replicas": 2},
            "metric": "vllm:num_requests_waiting",
            "last_decision": {"waiting": 3.0, "wants": 1, "reason": "at target"},
        },
    )
    console = Console(width=200, record=True)
    console.print(status_table([state]))
    text = console.export_text()
    assert "49 s (weights 43, engine 2, listening 2)" in text and "standby" in text
    assert "autoscale 1..2 on vllm:num_requests_waiting: 3 waiting, wants 1, at target" in text
