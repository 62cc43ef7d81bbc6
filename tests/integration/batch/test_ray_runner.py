"""`vlmserve batch --runner ray` on a real local Ray cluster, through the real gateway to a sim engine.

The module starts its own Ray head (`ray start --head`, 2 CPUs, a private temp dir, stopped at
the end). The same 2,000-line file, with malformed lines in it, goes through both runners and
the outputs are compared structurally: same custom_ids, each exactly once, same statuses, the
same malformed records. Then what differs between the runners — what a stop costs — and the
one-line errors of a Ray that is missing, unreachable, not Ray at all, or too small.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.gateway_proc import free_port, start_gateway
from tests.helpers.ray_cluster import start_ray_head
from tests.helpers.sim import start_sim_engine
from tests.integration.batch.test_batch_job import (
    MODEL,
    batch_argv,
    engine_requests_done,
    read_output,
    request_line,
    run_batch,
    wait_for_lines,
    write_input,
)

pytest.importorskip("ray.data", reason="the ray extra is not installed (pip install 'vlmserve[ray]')")

pytestmark = [pytest.mark.slow, pytest.mark.ray]
TOTAL = 2000
MALFORMED_EVERY = 97


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    with start_ray_head(tmp_path_factory.mktemp("ray")) as head:
        yield head


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A sim engine behind the vlmserve gateway; yields (gateway url, engine url)."""
    with (
        start_sim_engine(model=MODEL, ttft_ms=2, itl_ms=1, max_num_seqs=256) as engine,
        start_gateway([engine.base_url], tmp_path_factory.mktemp("gw")) as gateway,
    ):
        yield gateway.base_url, engine.base_url


def mixed_lines(total: int) -> list:
    """`total` lines; every MALFORMED_EVERY-th is broken in one of five ways (one of them not UTF-8)."""
    broken = [
        "{not json",
        b'{"custom_id": "\xff\xfe", "method": "POST"}',
        {"custom_id": "", "method": "POST", "url": "/v1/chat/completions", "body": {}},
        {"method": "GET", "url": "/v1/chat/completions", "body": {}},
        {"method": "POST", "url": "/v1/images", "body": {}},
    ]
    lines: list = []
    for index in range(total):
        if index % MALFORMED_EVERY == 5:
            kind = broken[(index // MALFORMED_EVERY) % len(broken)]
            lines.append({**kind, "custom_id": f"bad-{index}"} if isinstance(kind, dict) and "custom_id" not in kind else kind)
        else:
            lines.append(request_line(index, "/v1/completions" if index % 3 == 0 else "/v1/chat/completions"))
    return lines


def write_lines(path: Path, lines: list) -> Path:
    """Like test_batch_job.write_input, and bytes are written as they are (a line that is not UTF-8)."""
    with path.open("wb") as handle:
        for line in lines:
            raw = line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode()
            handle.write(raw + b"\n")
    return path


def expected_malformed(total: int) -> int:
    return sum(1 for index in range(total) if index % MALFORMED_EVERY == 5)


def run_ray(
    vlmserve_cmd, head, input_path: Path, output: Path, base_url: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`vlmserve batch --runner ray` against the module's head (with its token in the environment)."""
    return subprocess.run(
        batch_argv(vlmserve_cmd, input_path, output, base_url, *ray_args(head), *extra),
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **head.client_env, **(env or {})},
    )


def ray_args(head, *extra: str) -> tuple[str, ...]:
    return ("--runner", "ray", "--ray-address", head.address, "--ray-workers", "2", *extra)


def structure(records: list[dict]) -> dict:
    """What must match between the two runners: ids, statuses, error records, key sets; not ids of
    results (random) nor order (completion order) nor body text (the sim's words vary)."""
    by_key: dict = {}
    for record in records:
        error = record["error"]
        key = ("line", error["line"]) if error and error.get("code") == "malformed_line" else record["custom_id"]
        assert key not in by_key, f"answered twice: {key}"
        response = record["response"]
        by_key[key] = (
            sorted(record),
            record["custom_id"],
            error,
            None
            if response is None
            else (sorted(response), response["status_code"], sorted(response["body"]), "usage" in response["body"]),
        )
    return by_key


@pytest.mark.hostile(
    "batch --runner ray: malformed lines among 2,000 (not JSON, not UTF-8, empty custom_id, bad method or url): one error record each, the rest answered once, as by the built-in runner"
)
def test_same_file_same_output_through_both_runners(tmp_path, vlmserve_cmd, ray_head, served) -> None:
    gateway_url, _ = served
    input_path = write_lines(tmp_path / "in.jsonl", mixed_lines(TOTAL))
    builtin_out, ray_out = tmp_path / "builtin.jsonl", tmp_path / "ray.jsonl"
    builtin = run_batch(vlmserve_cmd, input_path, builtin_out, gateway_url, "--concurrency", "16", "--priority", "batch")
    via_ray = run_ray(vlmserve_cmd, ray_head, input_path, ray_out, gateway_url, "--concurrency", "16", "--priority", "batch")
    malformed = expected_malformed(TOTAL)
    for done in (builtin, via_ray):
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines()[-1] == (
            f"error: {malformed} lines failed; see their "
            f"response.status_code / error in {done.args[done.args.index('--output') + 1]}"
        )
        assert "Traceback" not in done.stderr
    records = read_output(ray_out)
    assert len(records) == TOTAL
    assert structure(records) == structure(read_output(builtin_out))
    counts = Counter(record["custom_id"] for record in records if record["error"] is None)
    assert len(counts) == TOTAL - malformed and max(counts.values()) == 1
    assert all(record["response"]["status_code"] == 200 for record in records if record["error"] is None)
    assert sum(1 for record in records if record["error"]) == malformed
    summary = via_ray.stderr
    assert "succeeded (whole job)" in summary and f"{TOTAL - malformed:,}" in summary


@pytest.mark.hostile(
    "batch --runner ray: the output ends in a cut line (a crash mid-write); the rerun sends only what is missing"
)
def test_rerun_resumes_from_partial_output_and_sends_only_what_is_missing(tmp_path, vlmserve_cmd, ray_head, served) -> None:
    gateway_url, engine_url = served
    total = 600
    input_path = write_lines(tmp_path / "in.jsonl", mixed_lines(total))
    output = tmp_path / "out.jsonl"
    first = run_ray(vlmserve_cmd, ray_head, input_path, output, gateway_url)
    assert first.returncode == 1, first.stderr
    whole = output.read_bytes().splitlines(keepends=True)
    kept = whole[: len(whole) // 2]
    output.write_bytes(b"".join(kept) + whole[len(whole) // 2][:25])  # half the lines, then a cut line
    missing_requests = sum(1 for line in whole[len(whole) // 2 :] if json.loads(line)["error"] is None)
    before = engine_requests_done(engine_url)
    again = run_ray(vlmserve_cmd, ray_head, input_path, output, gateway_url)
    assert again.returncode == 1, again.stderr
    assert f"resuming: {len(kept)} of {total} lines already answered" in again.stderr
    assert engine_requests_done(engine_url) - before == missing_requests
    records = read_output(output)
    assert len(records) == total and len(structure(records)) == total
    # a rerun of the finished job sends nothing and needs no Ray at all
    finished = run_batch(
        vlmserve_cmd, input_path, output, gateway_url, "--runner", "ray", "--ray-address", f"127.0.0.1:{free_port()}"
    )
    assert finished.returncode == 1 and len(read_output(output)) == total
    assert "cannot reach the Ray cluster" not in finished.stderr


@pytest.mark.hostile("batch --runner ray: Ctrl-C mid-job; whole lines only, exit 130, the rerun completes each id once")
def test_ctrl_c_keeps_whole_lines_and_a_rerun_completes_each_id_once(tmp_path, vlmserve_cmd, ray_head) -> None:
    """Unlike the built-in runner, results Ray holds when the driver stops are dropped: those requests
    are sent again by the rerun (more engine work than lines), but the output still has each id once."""
    total = 1500
    input_path = write_input(tmp_path / "in.jsonl", [request_line(index) for index in range(total)])
    output = tmp_path / "out.jsonl"
    with start_sim_engine(model=MODEL, ttft_ms=20, itl_ms=5, max_num_seqs=256) as slow:
        job = subprocess.Popen(
            batch_argv(vlmserve_cmd, input_path, output, slow.base_url, "--concurrency", "8", *ray_args(ray_head)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **ray_head.client_env},
        )
        try:
            wait_for_lines(output, 100, timeout_s=60)
        finally:
            job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=60)
        assert job.returncode == 130, stderr
        assert "rerun the same command to resume" in stderr and "Traceback" not in stderr
        partial = read_output(output)
        assert 100 <= len(partial) < total
        done = run_ray(vlmserve_cmd, ray_head, input_path, output, slow.base_url, "--concurrency", "32")
        assert done.returncode == 0, done.stderr
        sent = engine_requests_done(slow.base_url)
    counts = Counter(record["custom_id"] for record in read_output(output))
    assert len(counts) == total and max(counts.values()) == 1
    assert sent >= total  # requests in flight at the stop may have been answered and dropped: sent again


def test_a_local_ray_instance_when_no_address_is_given(tmp_path, vlmserve_cmd, served) -> None:
    gateway_url, _ = served
    input_path = write_input(tmp_path / "in.jsonl", [request_line(index) for index in range(40)])
    output = tmp_path / "out.jsonl"
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    done = subprocess.run(
        batch_argv(vlmserve_cmd, input_path, output, gateway_url, "--runner", "ray", "--ray-workers", "1"),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert len(structure(read_output(output))) == 40


def shadow_ray(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import ray` fails, as where the extra is not installed."""
    shadow = tmp_path / "shadow"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}


def bad_ray_case(case: str, message: str, why: str) -> object:
    return pytest.param(
        case, message, marks=pytest.mark.hostile(f"batch --runner ray: {why}: one line, exit 2, nothing written"), id=case
    )


@pytest.mark.parametrize(
    "case, message",
    [
        bad_ray_case(
            "not_installed",
            "--runner ray needs Ray Data, which is not installed: pip install 'vlmserve[ray]'",
            "Ray is not installed",
        ),
        bad_ray_case("closed_port", "cannot reach the Ray cluster at 127.0.0.1:", "--ray-address of a closed port"),
        bad_ray_case(
            "not_ray",
            "did not answer as a Ray cluster within 3 s",
            "--ray-address of a server that is not Ray (it accepts and never answers as Ray)",
        ),
        bad_ray_case("bad_address", "--ray-address 'nowhere': give HOST:PORT of the Ray head", "--ray-address without a port"),
        bad_ray_case("too_small", "has 2 CPUs; --ray-workers 64 needs 32", "more --ray-workers than the cluster has CPUs"),
        bad_ray_case("no_token", "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH", "a token-auth cluster and no token"),
        bad_ray_case("workers_without_ray", "--ray-workers only apply with --runner ray", "--ray-workers without --runner ray"),
        bad_ray_case("address_without_ray", "--ray-address only apply with --runner ray", "--ray-address without --runner ray"),
        bad_ray_case("bad_runner", "--runner 'spark': use builtin or ray", "an unknown --runner"),
    ],
)
def test_bad_ray_invocations_are_one_line_and_quick(tmp_path, vlmserve_cmd, ray_head, served, case, message) -> None:
    gateway_url, engine_url = served
    input_path = write_input(tmp_path / "in.jsonl", [request_line(0)])
    output = tmp_path / "out.jsonl"
    env = {**os.environ, **ray_head.client_env, "VLMSERVE_RAY_CONNECT_TIMEOUT_S": "3"}
    extra = {
        "not_installed": ("--runner", "ray"),
        "closed_port": ("--runner", "ray", "--ray-address", f"127.0.0.1:{free_port()}"),
        "not_ray": ("--runner", "ray", "--ray-address", engine_url.removeprefix("http://")),
        "bad_address": ("--runner", "ray", "--ray-address", "nowhere"),
        "too_small": ("--runner", "ray", "--ray-address", ray_head.address, "--ray-workers", "64"),
        "no_token": ("--runner", "ray", "--ray-address", ray_head.address),
        "workers_without_ray": ("--ray-workers", "4"),
        "address_without_ray": ("--ray-address", ray_head.address),
        "bad_runner": ("--runner", "spark"),
    }[case]
    if case == "not_installed":
        env = shadow_ray(tmp_path)
    elif case == "no_token":
        env = {key: value for key, value in env.items() if key not in ray_head.client_env}
    started = time.monotonic()
    done = subprocess.run(
        batch_argv(vlmserve_cmd, input_path, output, gateway_url, *extra), capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert time.monotonic() - started < 30
    assert not output.exists() or output.read_bytes() == b""
