"""`vlmserve tune` on sim engines whose cost model makes the optimum known by construction.

The engines are real `vlmserve engine sim` processes started by the supervisor from each
candidate's own spec; the load is the bench's; the planner is the sim engine's scheduler on the
virtual clock. The rehearsal cost model (engines.sim.rehearsal) multiplies every step's time by 2
per doubling away from max-num-seqs=16, max-num-batched-tokens=1024, api-server-count=2 (capped at
8): that point alone has factor 1, so its goodput under a TTFT SLO is the highest by construction,
about 2.4× the next (the planner predicts 13.5 against 5.7 req/s). The tests assert what the tune
did (which candidates, how many, what it recommends and why), never timings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers.procs import free_ports

OPTIMUM = {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "api_server_count": 2}
FLAGS = ["--flag", "max-num-seqs=4,8,16,64", "--flag", "max-num-batched-tokens=512,1024,4096", "--flag", "api-server-count=1,2"]
LOAD = [
    "--slo",
    "ttft_p95=400ms",
    "--rate-range",
    "1:32",
    "--precision",
    "0.3",
    "--max-probes",
    "4",
    "--repeat",
    "1",
    "--duration",
    "1s",
    "--input-len",
    "128",
    "--output-len",
    "16",
    "--arrival",
    "constant",
    "--timeout",
    "30",
]


def write_spec(path: Path, name: str, engine_args: dict[str, object], optimum: dict[str, int] = OPTIMUM) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "engine": "sim",
                "model": f"{name}-model",
                "gateway": False,
                "engine_args": engine_args,
                "sim": {"profile": "a10g-8b", "rehearsal_optimum": optimum},
            }
        )
    )
    return path


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "VLMSERVE_HOME": str(home), "COLUMNS": "220"}


def tune(vlmserve_cmd: list[str], home: Path, *args: object, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*vlmserve_cmd, "tune", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env(home)
    )


@pytest.mark.slow
def test_tune_finds_the_constructed_optimum_within_a_third_of_the_space_and_the_spec_starts(
    vlmserve_cmd: list[str], tmp_path: Path
) -> None:
    home, out = tmp_path / "home", tmp_path / "tune"
    spec = write_spec(
        tmp_path / "spec.yaml", "rehearsal", {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "api_server_count": 1}
    )
    done = tune(vlmserve_cmd, home, spec, *FLAGS, *LOAD, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    # the space: 24 points, the spec's own values among them (the baseline), the default budget a third
    assert result["space_size"] == 24 and result["budget"] == 8
    measured = [row for row in result["candidates"] if row["status"] != "not measured"]
    assert len(measured) <= 8 and result["measured"] + result["failed"] == len(measured)
    assert measured and min(row["order"] for row in measured if row["baseline"]) == 0, "the baseline is measured first"
    # the recommendation: the constructed optimum, or a candidate whose interval the optimum's overlaps
    recommended = result["recommended"]
    assert recommended is not None, result["sentence"]
    optimum_row = next(row for row in result["candidates"] if row["params"] == OPTIMUM)
    assert optimum_row["status"] == "measured", "the planner's first pick is the optimum; it must be measured"
    assert (
        recommended["params"] == OPTIMUM
        or recommended["id"] in result["within_best_interval"]
        or optimum_row["id"] in result["within_best_interval"]
    ), result["sentence"]
    assert "beats the baseline" in result["sentence"]
    # every figure is labelled: measured on the sim engine (simulated), predictions simulated
    assert result["goodput_label"].startswith("measured on the sim engine: simulated")
    assert "simulated" in done.stdout and "★" in done.stdout
    page = (out / "report.html").read_text()
    assert all(f'id="{chart}"' in page for chart in ("chart-tune-goodput", "chart-tune-predicted", "chart-tune-pareto"))
    # the recommended spec is the user's spec with the winner's flags, and it starts with `vlmserve up`
    written = yaml.safe_load((out / "recommended.yaml").read_text())
    assert written["name"] == "rehearsal" and written["sim"]["rehearsal_optimum"] == OPTIMUM
    assert {key: written["engine_args"][key] for key in OPTIMUM} == recommended["params"]
    assert_up_serves(vlmserve_cmd, home, out / "recommended.yaml", recommended["params"])


def assert_up_serves(vlmserve_cmd: list[str], home: Path, spec: Path, params: dict[str, object]) -> None:
    """`vlmserve up -f SPEC` starts, its replicas pass the supervisor's configuration verification (ready in
    state.json), the served model answers /v1/models, and the engine runs with the recommended flags."""
    from vlmserve.sweep.hygiene import verify_serving

    port = free_ports(2)
    proc = subprocess.Popen(
        [*vlmserve_cmd, "up", "-f", str(spec), "--port", str(port)],
        env=env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        state_file = home / "deployments" / "rehearsal" / "state.json"
        deadline = time.monotonic() + 120
        state = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                state = json.loads(state_file.read_text())
            except (OSError, json.JSONDecodeError):
                state = None
            if state and state["replicas"] and all(replica["state"] == "ready" for replica in state["replicas"]):
                break
            time.sleep(0.2)
        assert proc.poll() is None and state is not None, proc.stdout.read() if proc.stdout else ""
        replica = state["replicas"][0]
        verify_serving(replica["url"], "rehearsal-model")
        argv = psutil.Process(replica["pid"]).cmdline()
        for name, value in params.items():
            flag = "--" + name.replace("_", "-")
            assert argv[argv.index(flag) + 1] == str(value), (flag, argv)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode in (0, 130)


@pytest.mark.slow
@pytest.mark.hostile("tune: SIGINT mid-tune keeps every finished candidate; the same command resumes without re-measuring them")
def test_an_interrupted_tune_resumes_without_remeasuring(vlmserve_cmd: list[str], tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "tune"
    spec = write_spec(tmp_path / "spec.yaml", "resume", {"max_num_seqs": 64, "max_num_batched_tokens": 4096})
    args = [
        spec,
        "--flag",
        "max-num-seqs=16,64",
        "--flag",
        "max-num-batched-tokens=1024,4096",
        *LOAD,
        "--max-candidates",
        "4",
        "--out",
        out,
    ]
    proc = subprocess.Popen(
        [*vlmserve_cmd, "tune", *map(str, args)], env=env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    store = out / "tune.json"
    deadline = time.monotonic() + 300
    finished: list[dict[str, object]] = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            finished = json.loads(store.read_text())["candidates"]
        except (OSError, json.JSONDecodeError, KeyError):
            finished = []
        if finished:
            break
        time.sleep(0.2)
    assert finished and proc.poll() is None, "one candidate finished while the tune still runs"
    time.sleep(1.0)  # the next candidate's engine is starting or being measured
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    kept = json.loads(store.read_text())["candidates"]
    assert (
        f"error: tune interrupted; {len(kept)} candidate(s) finished and kept in {out}; rerun the same command to resume" in err
    )
    assert "Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"engines left running after the interrupt: {alive}"
    # the same command again: the finished candidates are not measured again
    done = tune(vlmserve_cmd, home, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming the tune in {out}: {len(kept)} of 4 candidates already done" in done.stderr
    after = {row["id"]: row for row in json.loads(store.read_text())["candidates"]}
    assert len(after) == 4
    for row in kept:
        assert after[row["id"]]["measured_at"] == row["measured_at"] and after[row["id"]]["run_ids"] == row["run_ids"]
    measuring_lines = [line for line in done.stderr.splitlines() if line.startswith("[") and "/4]" in line]
    assert len(measuring_lines) == 4 - len(kept), done.stderr


@pytest.mark.slow
@pytest.mark.hostile("tune: a candidate whose engine refuses to start is recorded failed with its log; the tune goes on")
def test_a_candidate_that_fails_to_start_is_recorded_with_its_log(vlmserve_cmd: list[str], tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "tune"
    spec = write_spec(tmp_path / "spec.yaml", "failing", {"max_num_seqs": 16, "max_model_len": 2048}, {"max_num_seqs": 16})
    # 1 Mi tokens of context does not fit the sim engine's KV cache (8192 blocks of 16 tokens): it exits at start
    done = tune(vlmserve_cmd, home, spec, "--flag", "max-model-len=2048,1048576", *LOAD, "--max-candidates", "2", "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["params"]["max_model_len"]: row for row in json.loads((out / "result.json").read_text())["candidates"]}
    failed, fine = rows[1048576], rows[2048]
    assert failed["status"] == "failed" and fine["status"] == "measured" and fine["baseline"]
    assert failed["why"].startswith("failed: ") and "replica 0" in failed["reason"]
    assert failed["predicted_note"].startswith("would not start: the KV cache")
    log = Path(failed["log"])
    assert log.is_file() and log.parent.parent.name == failed["id"] and "KV cache" in log.read_text()
    assert "✗ failed" in done.stderr and f"(log: {log})" in done.stderr
    assert json.loads((out / "result.json").read_text())["recommended"]["id"] == fine["id"]
