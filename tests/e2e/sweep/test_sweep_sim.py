"""Sweeps end to end against real sim-engine processes started by the supervisor.

The two example studies run from their real YAML files (shrunk by the CLI's scale options),
a sweep with an injected failing cell and failing deployment finishes and resumes without
redoing finished cells, and Ctrl-C keeps every finished cell.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.browser import CHART_IDS, check_report_in_browser, find_chromium
from tests.helpers.paths import REPO_ROOT
from tests.helpers.procs import free_port
from vlmserve.deploy.processes import port_is_free
from vlmserve.errors import UserError
from vlmserve.report.source import results_from_sweep_dir
from vlmserve.sweep.runner import SweepOverrides, apply_overrides, run_sweep
from vlmserve.sweep.spec import parse_sweep_spec

REPO = REPO_ROOT
SMOKE = ["--requests-per-user", "2", "--max-output-len", "8", "--no-progress"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private VLMSERVE_HOME: the run store and deployment state of this test only."""
    path = tmp_path / "home"
    monkeypatch.setenv("VLMSERVE_HOME", str(path))
    return path


def run_cli(vlmserve_cmd: list[str], home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLMSERVE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*vlmserve_cmd, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


@pytest.mark.slow
def test_prompt_length_study_end_to_end(home: Path, tmp_path: Path, vlmserve_cmd: list[str], artifacts_dir: Path) -> None:
    out = tmp_path / "prompt-lengths"
    # users ×0.25 (64 -> 16, 16 -> 4, 4 and 1 -> 1): every cell still runs; at 64 users the simulated H100
    # took 7 s of 2,048-token prefills for nothing this test checks
    done = run_cli(
        vlmserve_cmd,
        home,
        "sweep",
        "examples/sweep-prompt-lengths.yaml",
        "--out",
        str(out),
        "--md",
        str(out / "summary.md"),
        "--scale-users",
        "0.25",
        *SMOKE,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "15 of 15 cells succeeded" in done.stdout
    results = results_from_sweep_dir(out)
    assert all(cell.ok for cell in results.cells)
    by_name = {cell.cell: cell for cell in results.cells}
    # the workloads really differ: longer prompts, images and conversations reached the server
    assert by_name["in2048-c1"].metric("tokens.actual_prompt_mean") > 4 * by_name["in128-c1"].metric("tokens.actual_prompt_mean")
    assert by_name["images-c4"].metric("tokens.images_total") > 0
    assert by_name["chat-u4"].summary.to_dict()["meta"]["load_spec"]["dataset"] == "sharegpt"
    assert "| rank | deployment |" in (out / "summary.md").read_text()
    assert (
        "shrunk run (users and rates ×0.25; 2 requests per user (counts and durations replaced); outputs capped at 8 tokens)"
    ) in (out / "report.html").read_text()
    (artifacts_dir / "sweep-prompt-lengths.html").write_bytes((out / "report.html").read_bytes())


@pytest.mark.slow
def test_replica_study_end_to_end(home: Path, tmp_path: Path, vlmserve_cmd: list[str], artifacts_dir: Path) -> None:
    out = tmp_path / "replicas"
    # every deployment (1, 2, 4, 8 replicas started fresh), three of the six user levels to keep CI quick
    done = run_cli(
        vlmserve_cmd,
        home,
        "sweep",
        "examples/sweep-replicas.yaml",
        "--out",
        str(out),
        "--scale-users",
        "0.04",
        "--cells",
        "u150,u300,u400",
        *SMOKE,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 of 12 cells succeeded" in done.stdout
    results = results_from_sweep_dir(out)
    assert [info.devices for info in results.deployments] == [1, 2, 4, 8]
    assert {info.status for info in results.deployments} == {"done"}
    # every deployment really ran its replicas: the spec recorded with each run says so
    replicas = {cell.deployment: cell.summary.to_dict()["meta"]["deployment"]["replicas"] for cell in results.cells}
    assert replicas == {"r1": 1, "r2": 2, "r4": 4, "r8": 8}
    (artifacts_dir / "sweep-replicas.html").write_bytes((out / "report.html").read_bytes())
    if find_chromium():
        # the per-shape plots too, the CDF and timeline from the records the sweep stored
        shape_charts = ("chart-latency-throughput-0", "chart-cdf-0", "chart-timeline-0")
        checks = check_report_in_browser(
            out / "report.html",
            artifacts_dir / "sweep-replicas.png",
            chart_ids=CHART_IDS + shape_charts,
            title_mark="(simulated)",
        )
        assert checks["chart-cdf-0"] == 3 * len(results.cells), "TTFT, TPOT and E2E curves for every cell"


FAILING_SPEC = """
name: failures
deployments:
  - name: good
    spec: {engine: sim, model: m, replicas: 1, gateway: false, sim: {ttft_ms: 5, itl_ms: 2},
           engine_args: {max_model_len: 512}}
  - name: blocked
    spec: {engine: sim, model: m, replicas: 1, gateway: false, replica_base_port: BLOCKED_PORT, sim: {ttft_ms: 5, itl_ms: 2}}
  - name: broken
    spec: {engine: sim, model: m, replicas: 1, gateway: false, sim: {profile: no-such-profile}, ready_timeout_s: 30}
  - name: gone
    endpoint: http://127.0.0.1:CLOSED_PORT
    model: m
cells:
  - {name: short-c1, input_len: 16, output_len: 4, concurrency: 1, num_requests: 4}
  - {name: too-long, input_len: 2000, output_len: 4, concurrency: 1, num_requests: 2}
  - {name: short-c2, input_len: 16, output_len: 4, concurrency: 2, num_requests: 4}
warmup_requests: 2
"""


def test_failing_cell_and_deployment_are_recorded_and_resume_skips_finished(home: Path, tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    blocked_port = blocker.getsockname()[1]
    text = FAILING_SPEC.replace("BLOCKED_PORT", str(blocked_port)).replace("CLOSED_PORT", str(free_port()))
    spec = parse_sweep_spec(__import__("yaml").safe_load(text), "failures.yaml")
    out = tmp_path / "sweep"
    try:
        run_sweep(spec, out, progress=False)
    finally:
        blocker.close()
    results = results_from_sweep_dir(out)
    status = {(cell.deployment, cell.cell): cell for cell in results.cells}
    assert status[("good", "short-c1")].ok and status[("good", "short-c2")].ok
    too_long = status[("good", "too-long")]
    assert too_long.status == "failed" and too_long.reason and "400" in too_long.reason
    assert results.deployment("blocked").status == "failed"
    assert f"port {blocked_port} on 127.0.0.1 is already in use" in (results.deployment("blocked").reason or "")
    assert "is unreachable" in (results.deployment("gone").reason or "")
    assert "no-such-profile" in (results.deployment("broken").reason or "")
    assert results.outcome_line().startswith("2 of 12 cells succeeded; deployment blocked failed: port")
    assert "the too-long cell on good failed: " in results.outcome_line()

    finished = {key: cell.run_id for key, cell in status.items() if cell.ok}
    # resume: the port is free now, so 'blocked' runs; finished cells are not redone
    run_sweep(spec, out, progress=False)
    again = {(cell.deployment, cell.cell): cell for cell in results_from_sweep_dir(out).cells}
    for key, run_id in finished.items():
        assert again[key].run_id == run_id, f"{key} was redone"
    assert again[("blocked", "short-c1")].ok and again[("blocked", "short-c2")].ok
    assert again[("good", "too-long")].status == "failed"
    assert port_is_free("127.0.0.1", blocked_port), "the sweep left its engine running"


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_keeps_finished_cells(home: Path, tmp_path: Path, vlmserve_cmd: list[str], stop_signal: int) -> None:
    spec_file = tmp_path / "interrupt.yaml"
    spec_file.write_text("""
name: interrupt
deployments:
  - name: sim
    spec: {engine: sim, model: m, replicas: 1, gateway: false, sim: {ttft_ms: 5, itl_ms: 5}}
cells:
  - {name: quick, input_len: 16, output_len: 4, concurrency: 1, num_requests: 3}
  - {name: long, input_len: 16, output_len: 4, concurrency: 1, duration_s: 120}
warmup_requests: 0
""")
    out = tmp_path / "out"
    env = {**os.environ, "VLMSERVE_HOME": str(home)}
    process = subprocess.Popen(
        [*vlmserve_cmd, "sweep", str(spec_file), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if (out / "manifest.json").exists() and manifest(out)["cells"].get("sim/quick", {}).get("status") == "done":
                break
            time.sleep(0.3)
        time.sleep(1.5)  # inside the long cell now
        process.send_signal(stop_signal)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "sweep interrupted; 1 of 2 cells finished and kept" in stderr
    assert manifest(out)["cells"]["sim/quick"]["status"] == "done"
    state = json.loads((home / "deployments" / "sim" / "state.json").read_text())
    assert all(replica.get("state") == "stopped" for replica in state["replicas"])


def test_cells_filter_names_what_exists() -> None:
    spec = parse_sweep_spec(
        {
            "name": "s",
            "deployments": [{"name": "e", "endpoint": "http://127.0.0.1:1", "model": "m"}],
            "cells": [{"name": "a1", "concurrency": 1, "num_requests": 1}, {"name": "b1", "concurrency": 1, "num_requests": 1}],
        },
        "s",
    )
    assert [cell.name for cell in apply_overrides(spec, SweepOverrides(cell_patterns=("a*",))).cells] == ["a1"]
    with pytest.raises(UserError, match="--cells zz matches no cell; the spec has: a1, b1"):
        apply_overrides(spec, SweepOverrides(cell_patterns=("zz",)))


def test_overrides_shrink_cells() -> None:
    spec = parse_sweep_spec(
        {
            "name": "s",
            "deployments": [{"name": "e", "endpoint": "http://127.0.0.1:1", "model": "m"}],
            "cells": [{"name": "c", "concurrency": 100, "duration_s": 60, "output_len": 128}],
        },
        "s",
    )
    load = SweepOverrides(request_scale=0.1, user_scale=0.04, max_output_len=8).apply(spec.cells[0].load)
    assert (load.concurrency, load.duration_s, load.output_len) == (4, 6.0, 8)
    load = SweepOverrides(user_scale=0.04, requests_per_user=3).apply(spec.cells[0].load)
    assert (load.concurrency, load.num_requests, load.duration_s) == (4, 12, None)
