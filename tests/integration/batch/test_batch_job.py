"""`vlmserve batch` against a real sim engine (and the real gateway), run as a subprocess.

The job is killed for real (SIGKILL, SIGINT) and resumed; the output is then checked line by
line: every custom_id answered exactly once, nothing partial, failures where they belong.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.helpers.gateway_proc import free_port, start_gateway
from tests.helpers.sim import start_sim_engine

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sim():
    """One fast engine for the module: ~2 ms TTFT, ~1 ms per token."""
    with start_sim_engine(model=MODEL, ttft_ms=2, itl_ms=1) as engine:
        yield engine


def request_line(index: int, url: str = "/v1/chat/completions") -> dict:
    if url == "/v1/completions":
        body = {"model": MODEL, "prompt": f"note {index}", "max_tokens": 4}
    else:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"summarise report {index}"}], "max_tokens": 4}
    return {"custom_id": f"req-{index}", "method": "POST", "url": url, "body": body}


def write_input(path: Path, lines: list) -> Path:
    with path.open("w") as handle:
        for line in lines:
            handle.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def batch_argv(vlmserve_cmd: list[str], input_path: Path, output: Path, base_url: str, *extra: str) -> list[str]:
    return [*vlmserve_cmd, "batch", str(input_path), "--output", str(output), "--base-url", base_url, "--no-progress", *extra]


def run_batch(vlmserve_cmd, input_path, output, base_url, *extra, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        batch_argv(vlmserve_cmd, input_path, output, base_url, *extra), capture_output=True, text=True, timeout=timeout
    )


def read_output(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), "output must end with a complete line"
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def wait_for_lines(path: Path, at_least: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {at_least} lines")


def engine_requests_done(base_url: str) -> float:
    """Requests the engine finished, from its own /metrics (vllm:request_success_total)."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total"))


def test_killed_job_resumes_and_answers_each_id_once(tmp_path, vlmserve_cmd, sim) -> None:
    total = 600
    input_path = write_input(tmp_path / "in.jsonl", [request_line(i) for i in range(total)])
    output = tmp_path / "out.jsonl"
    job = subprocess.Popen(
        batch_argv(vlmserve_cmd, input_path, output, sim.base_url, "--concurrency", "8"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_lines(output, 150)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=10)
    answered_before = output.read_bytes().count(b"\n")
    assert answered_before < total, "the job finished before it could be killed; make it longer"
    # a killed writer may leave half a line; simulate the worst case explicitly too
    with output.open("ab") as handle:
        handle.write(b'{"id":"batch_req_x","custom_id":"req-')
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url, "--concurrency", "8")
    assert done.returncode == 0, done.stderr
    assert "resuming:" in done.stderr
    records = read_output(output)
    counts = Counter(record["custom_id"] for record in records)
    assert set(counts) == {f"req-{i}" for i in range(total)}
    assert max(counts.values()) == 1
    assert all(record["response"]["status_code"] == 200 and record["error"] is None for record in records)
    assert all(record["id"].startswith("batch_req_") for record in records)
    first = records[0]["response"]["body"]
    assert first["choices"][0]["message"]["content"] and first["usage"]["completion_tokens"] > 0


def test_ctrl_c_stops_cleanly_and_a_rerun_completes(tmp_path, vlmserve_cmd, sim) -> None:
    total = 600
    input_path = write_input(tmp_path / "in.jsonl", [request_line(i) for i in range(total)])
    output = tmp_path / "out.jsonl"
    job = subprocess.Popen(
        batch_argv(vlmserve_cmd, input_path, output, sim.base_url, "--concurrency", "8"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_lines(output, 100)
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=30)
    assert job.returncode == 130
    assert "rerun the same command to resume" in stderr
    partial = read_output(output)  # ends with a newline: in-flight requests finished whole
    assert len(partial) < total
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert done.returncode == 0, done.stderr
    counts = Counter(record["custom_id"] for record in read_output(output))
    assert len(counts) == total and max(counts.values()) == 1


def test_malformed_lines_become_error_lines_and_the_job_goes_on(tmp_path, vlmserve_cmd, sim) -> None:
    lines = [
        request_line(0),
        "{not json",
        request_line(1, "/v1/completions"),
        {"custom_id": "wrong-url", "method": "POST", "url": "/v1/images", "body": {}},
        {"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"},
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
        "",
        {
            "custom_id": "streaming",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "stream": True, "messages": []},
        },
        request_line(2),
    ]
    input_path = write_input(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url, "--price-per-gpu-hour", "2.5", "--gpus", "2")
    assert done.returncode == 1
    assert "error: 5 lines failed" in done.stderr
    assert "malformed_line" in done.stderr and "cost of this run (2 GPU x $2.5/h)" in done.stderr
    records = read_output(output)
    assert len(records) == 8
    ok = {record["custom_id"] for record in records if record["error"] is None}
    assert ok == {"req-0", "req-1", "req-2"}
    errors = {record["error"]["line"]: record for record in records if record["error"] is not None}
    assert set(errors) == {2, 4, 5, 6, 8}
    assert "not valid JSON" in errors[2]["error"]["message"] and errors[2]["custom_id"] is None
    assert errors[4]["custom_id"] == "wrong-url" and "'url' must be one of" in errors[4]["error"]["message"]
    assert "'body' must be a JSON object" in errors[5]["error"]["message"]
    assert "'custom_id' must be a non-empty string" in errors[6]["error"]["message"]
    assert "stream" in errors[8]["error"]["message"]
    # a rerun changes nothing: malformed lines count as answered
    again = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert again.returncode == 1 and len(read_output(output)) == 8


def test_duplicate_custom_ids_are_refused_before_anything_is_sent(tmp_path, vlmserve_cmd, sim) -> None:
    lines = [request_line(i) for i in range(50)] + [request_line(7)]
    input_path = write_input(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    before = engine_requests_done(sim.base_url)
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: {input_path}: custom_id 'req-7' appears on lines 8, 51; custom_ids "
        "must be unique — fix the file (nothing was sent)"
    )
    assert not output.exists()
    assert engine_requests_done(sim.base_url) == before


def test_5xx_are_retried_until_answered(tmp_path, vlmserve_cmd) -> None:
    with start_sim_engine(model=MODEL, ttft_ms=2, itl_ms=1, error_rate=0.3) as flaky:
        input_path = write_input(tmp_path / "in.jsonl", [request_line(i) for i in range(40)])
        output = tmp_path / "out.jsonl"
        done = run_batch(vlmserve_cmd, input_path, output, flaky.base_url, "--max-retries", "10")
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert len(records) == 40 and all(record["response"]["status_code"] == 200 for record in records)
    retries = next(line for line in done.stderr.splitlines() if "retries" in line)
    assert int(retries.split("│")[2].strip().replace(",", "")) > 0


def test_through_the_gateway_at_batch_priority_honouring_retry_after(tmp_path, vlmserve_cmd, sim) -> None:
    """Two replicas behind a gateway that admits two requests at a time and queues none: the
    job spreads over both replicas, and the gateway's 429 + Retry-After is waited out, not hammered."""
    flags = ("--max-in-flight", "2", "--queue-limit-batch", "0", "--queue-limit-interactive", "0")
    with (
        start_sim_engine(model=MODEL, ttft_ms=2, itl_ms=1) as second,
        start_gateway([sim.base_url, second.base_url], tmp_path, *flags) as gateway,
    ):
        before = {url: engine_requests_done(url) for url in (sim.base_url, second.base_url)}
        input_path = write_input(tmp_path / "in.jsonl", [request_line(i) for i in range(16)])
        output = tmp_path / "out.jsonl"
        started = time.monotonic()
        done = run_batch(
            vlmserve_cmd,
            input_path,
            output,
            gateway.base_url + "/v1",
            "--priority",
            "batch",
            "--concurrency",
            "6",
            "--max-retries",
            "20",
        )
        elapsed = time.monotonic() - started
        shed = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
        served = {url: engine_requests_done(url) - count for url, count in before.items()}
    assert done.returncode == 0, done.stderr
    assert len(read_output(output)) == 16
    assert all(count > 0 for count in served.values()) and sum(served.values()) == 16, served
    assert "vlmserve_gateway_shed_requests_total{" in shed
    assert elapsed >= 1.0  # at least one Retry-After (>= 1 s) was honoured


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_input", "no such file; give the batch input JSONL"),
        ("same_file", "--output must differ from the input file"),
        ("bad_scheme", "must start with http:// or https://"),
        ("foreign_output", "is not a batch result line"),
        ("empty_input", "no request lines"),
        ("bad_priority", "--priority 'urgent': use batch or interactive"),
    ],
)
def test_bad_invocations_are_one_line(tmp_path, vlmserve_cmd, sim, case: str, message: str) -> None:
    input_path = write_input(tmp_path / "in.jsonl", [request_line(0)])
    output = tmp_path / "out.jsonl"
    base_url, extra = sim.base_url, []
    if case == "missing_input":
        input_path = tmp_path / "absent.jsonl"
    elif case == "same_file":
        output = input_path
    elif case == "bad_scheme":
        base_url = "127.0.0.1:9"
    elif case == "foreign_output":
        output.write_text("hello\n")
    elif case == "empty_input":
        input_path.write_text("\n\n")
    elif case == "bad_priority":
        extra = ["--priority", "urgent"]
    done = run_batch(vlmserve_cmd, input_path, output, base_url, *extra)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_unreachable_endpoint_sends_nothing_and_writes_nothing(tmp_path, vlmserve_cmd) -> None:
    input_path = write_input(tmp_path / "in.jsonl", [request_line(0)])
    output = tmp_path / "out.jsonl"
    done = run_batch(vlmserve_cmd, input_path, output, f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "cannot reach" in done.stderr and "(nothing was sent)" in done.stderr
    assert not output.exists() or output.read_bytes() == b""


def test_engine_dying_mid_job_loses_nothing(tmp_path, vlmserve_cmd, sim) -> None:
    """Requests that got no answer are not recorded; the job stops, and a rerun sends them."""
    total = 200
    input_path = write_input(tmp_path / "in.jsonl", [request_line(i) for i in range(total)])
    output = tmp_path / "out.jsonl"
    with start_sim_engine(model=MODEL, ttft_ms=2, itl_ms=1) as doomed:
        job = subprocess.Popen(
            batch_argv(vlmserve_cmd, input_path, output, doomed.base_url, "--concurrency", "4", "--max-retries", "1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for_lines(output, 40)
        doomed.kill()
        _, stderr = job.communicate(timeout=60)
    assert job.returncode == 1
    assert "the endpoint stopped answering" in stderr and "rerun the same command" in stderr
    assert len(read_output(output)) < total
    done = run_batch(vlmserve_cmd, input_path, output, sim.base_url)  # a replacement engine
    assert done.returncode == 0, done.stderr
    counts = Counter(record["custom_id"] for record in read_output(output))
    assert len(counts) == total and max(counts.values()) == 1
