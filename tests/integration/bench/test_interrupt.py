"""Ctrl-C during a bench keeps every record: outputs are still written, marked interrupted, exit 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.helpers.sim import start_sim_engine

MODEL = "interrupt-sim"
NUM_REQUESTS = 200
"""Far more than are sent before the Ctrl-C (about 1.5 s in: 6 users x 1 s answers, or 20/s), so the run
is always stopped early; not more, because the bench fits every prompt before it sends (about 10 ms each
against the sim's /tokenize: 1,000 prompts cost 10 s)."""


def _running_requests(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _bench_until_ctrl_c(
    base_url: str, tmp_path: Path, presses: int, *extra: str
) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """Start a long bench, wait until requests are in flight, press Ctrl-C `presses` times."""
    json_out, records_out = tmp_path / "s.json", tmp_path / "r.parquet"
    env = {**os.environ, "VLMSERVE_HOME": str(tmp_path / "home")}
    command = [
        sys.executable,
        "-m",
        "vlmserve",
        "bench",
        "--base-url",
        base_url,
        "--model",
        MODEL,
        "--input-len",
        "8",
        "--output-len",
        "40",
        "--num-requests",
        str(NUM_REQUESTS),
        "--no-progress",
        "--json-out",
        str(json_out),
        "--records-out",
        str(records_out),
        *extra,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while _running_requests(base_url) < 2:  # the load has started and answers are streaming
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the bench never started sending"
            time.sleep(0.2)
        time.sleep(1.0)  # some requests finish (each takes ~1 s), others are mid-answer
        for _ in range(presses):
            process.send_signal(signal.SIGINT)
            time.sleep(0.3)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    done = subprocess.CompletedProcess(command, process.returncode, out, err)
    return done, json.loads(json_out.read_text()), records_out


@pytest.fixture(scope="module")
def slow_sim():
    """Each answer takes about a second (40 tokens, 25 ms apart), so Ctrl-C lands mid-stream."""
    with start_sim_engine(model=MODEL, ttft_ms=20, itl_ms=25) as handle:
        yield handle


@pytest.mark.parametrize("workers", [[], ["--workers", "1"], ["--workers", "2"]], ids=["in-process", "1-worker", "2-workers"])
def test_one_ctrl_c_stops_sending_and_lets_requests_in_flight_finish(slow_sim, tmp_path, workers):
    done, summary, records_out = _bench_until_ctrl_c(slow_sim.base_url, tmp_path, 1, "--concurrency", "6", *workers)
    assert summary["client"]["in_process"] is (not workers)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert "no new requests" in done.stderr and "interrupted by Ctrl-C" in done.stderr
    assert "INTERRUPTED" in done.stdout
    assert summary["meta"]["interrupted"] is True
    requests = summary["requests"]
    # stopped early, and the requests in flight were given time to finish: nothing failed
    assert 6 <= requests["completed"] < NUM_REQUESTS and requests["failed"] == 0
    rows = pq.read_table(records_out).num_rows
    assert rows == requests["total"] == requests["completed"]
    assert summary["ttft_ms"]["p50"] is not None
    # the run history keeps it too, flagged
    env = {**os.environ, "VLMSERVE_HOME": str(tmp_path / "home")}
    listed = subprocess.run([sys.executable, "-m", "vlmserve", "runs", "list", "--json"], capture_output=True, text=True, env=env)
    assert json.loads(listed.stdout)[0]["interrupted"] is True


def test_second_ctrl_c_cancels_requests_in_flight_and_keeps_their_records(slow_sim, tmp_path):
    done, summary, records_out = _bench_until_ctrl_c(slow_sim.base_url, tmp_path, 2, "--rate", "20", "--workers", "2")
    assert done.returncode == 130, done.stderr
    assert "Ctrl-C again" in done.stderr and "Traceback" not in done.stderr
    requests = summary["requests"]
    assert requests["failed"] >= 1 and requests["failed_by_cause"].get("interrupted", 0) == requests["failed"]
    table = pq.read_table(records_out)
    assert table.num_rows == requests["total"]
    kinds = table.column("error_kind").to_pylist()
    assert kinds.count("interrupted") == requests["failed"]
    assert kinds.count(None) == requests["completed"] >= 1
