"""The bench never loses records: whatever fails after the load, the results are written.

The engine is killed for real (SIGKILL) while the bench, also a real subprocess, is
mid-run; the post-run steps that talk to it (/tokenize re-count, /metrics) then fail.
The records and the summary must still reach JSON, Parquet and the history, with a
warning, and the bench exits 3 ("written, with warnings").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers.bench_fixtures import SIM_MODEL
from tests.helpers.sim import SimHandle, free_port, start_sim_engine

WARNINGS_EXIT_CODE = 3
"""Documented in docs/metrics.md: results written, but a post-run step failed."""


def _engine_finished(handle: SimHandle) -> float:
    text = handle.metrics_text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total"))


@pytest.mark.hostile("bench: the engine dies mid-run; records and summary are still written, with a warning")
def test_engine_killed_mid_run_keeps_every_record(
    tmp_path: Path, vlmserve_home: Path, record_property: Callable[[str, object], None]
) -> None:
    requests = 400
    json_out, parquet_out = tmp_path / "run.json", tmp_path / "run.parquet"
    with start_sim_engine(model=SIM_MODEL, ttft_ms=5, itl_ms=2, seed=3) as engine:
        argv = [
            sys.executable,
            "-m",
            "vlmserve",
            "bench",
            "--base-url",
            engine.base_url,
            "--model",
            SIM_MODEL,
            "--no-progress",
            "--concurrency",
            "4",
            "--num-requests",
            str(requests),
            "--output-len",
            "16",
            "--server-metrics-interval",
            "0",
            "--json-out",
            str(json_out),
            "--records-out",
            str(parquet_out),
        ]
        bench = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "VLMSERVE_HOME": str(vlmserve_home)},
        )
        try:
            deadline = time.monotonic() + 60
            while _engine_finished(engine) < 60:
                assert bench.poll() is None, bench.communicate()
                assert time.monotonic() < deadline, "the engine never finished 60 requests"
                time.sleep(0.05)
            engine.kill()
            out, err = bench.communicate(timeout=120)
        finally:
            if bench.poll() is None:
                bench.kill()
    assert "Traceback" not in err, err
    assert bench.returncode == WARNINGS_EXIT_CODE, err
    warning_lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert any("/tokenize" in line for line in warning_lines), err

    summary = json.loads(json_out.read_text())
    assert summary["warnings"] and any("/tokenize" in text for text in summary["warnings"])
    rows = pq.read_table(parquet_out).to_pylist()
    record_property("requests_sent", requests)
    record_property("requests_lost", requests - len(rows))
    assert len(rows) == requests  # every request sent has its record, answered or not
    completed = [row for row in rows if row["ok"]]
    assert len(completed) >= 60 and len(completed) < requests
    assert summary["requests"]["completed"] == len(completed)

    from vlmserve.results import store

    stored = store.list_runs()
    assert len(stored) == 1 and stored[0]["completed"] == len(completed)


@pytest.mark.hostile("bench: the tokenizer endpoint goes away while prompts are prepared; one line, exit 2")
def test_tokenizer_endpoint_unreachable_while_preparing_is_one_line() -> None:
    from vlmserve.bench.tokens import ServerTokenCounter
    from vlmserve.errors import UserError

    counter = ServerTokenCounter(f"http://127.0.0.1:{free_port()}", SIM_MODEL)  # nothing listens there
    with pytest.raises(UserError) as raised:
        counter.count_prompt("chat", "hello", [{"role": "user", "content": "hello"}])
    message = str(raised.value)
    assert "\n" not in message and "cannot reach" in message and "--tokenizer" in message
