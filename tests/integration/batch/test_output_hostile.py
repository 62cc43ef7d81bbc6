"""The output file under attack: a second run on it, a full disk, a read-only folder.

Real processes, a real sim engine, and real filesystems: a tiny tmpfs fills up for
real (root may mount one; the tests skip, saying why, where mounting is not allowed).
Every case ends with the OpenAI Batch promise checked line by line: each custom_id
answered exactly once, and no partial line.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.sim import start_sim_engine
from tests.integration.batch.test_batch_job import (
    MODEL,
    batch_argv,
    read_output,
    request_line,
    run_batch,
    wait_for_lines,
    write_input,
)


@pytest.fixture(scope="module")
def slow_sim():
    """An engine slow enough that a 300-line job takes a couple of seconds at concurrency 4."""
    with start_sim_engine(model=MODEL, ttft_ms=5, itl_ms=5) as engine:
        yield engine


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, tiny filesystem at `path` (unmounted after)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_each_id_once(output: Path, total: int) -> None:
    ids = Counter(record["custom_id"] for record in read_output(output))
    assert sorted(ids) == sorted(f"req-{index}" for index in range(total))
    assert set(ids.values()) == {1}, [cid for cid, count in ids.items() if count > 1][:5]


@pytest.mark.hostile("batch: two runs on one output; the second refuses naming the first's pid, ids stay unique")
def test_second_run_on_the_same_output_refuses(tmp_path, vlmserve_cmd, slow_sim) -> None:
    total = 300
    input_path = write_input(tmp_path / "in.jsonl", [request_line(index) for index in range(total)])
    output = tmp_path / "out.jsonl"
    first = subprocess.Popen(
        batch_argv(vlmserve_cmd, input_path, output, slow_sim.base_url, "--concurrency", "4"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_lines(output, 10)
        second = run_batch(vlmserve_cmd, input_path, output, slow_sim.base_url, "--concurrency", "4")
        first_out, first_err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stderr
    assert "Traceback" not in second.stderr
    assert error_lines(second.stderr) == [
        f"error: {output} is being written by another batch run (pid {first.pid}); wait for it to finish "
        "(or stop it), or pick another --output"
    ]
    assert first.returncode == 0, first_err
    assert_each_id_once(output, total)


@pytest.mark.hostile("batch: the disk fills mid-job; one line, no partial line, the rerun answers each id once")
def test_full_disk_stops_cleanly_and_the_rerun_resumes_exactly_once(tmp_path, vlmserve_cmd, slow_sim) -> None:
    total = 300  # ~600 bytes a result: ~180 KB, and the disk holds 64 KB
    input_path = write_input(tmp_path / "in.jsonl", [request_line(index) for index in range(total)])
    with tmpfs(tmp_path / "small", "64k") as disk:
        output = disk / "out.jsonl"
        full = run_batch(vlmserve_cmd, input_path, output, slow_sim.base_url, "--concurrency", "4")
        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr
        lines = error_lines(full.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {output}: No space left on device"), full.stderr
        assert "rerun the same command" in lines[0]
        written = read_output(output)  # ends with a newline: no partial line
        assert 0 < len(written) < total
        assert len({record["custom_id"] for record in written}) == len(written)

        remount(disk, "size=4m")
        rerun = run_batch(vlmserve_cmd, input_path, output, slow_sim.base_url, "--concurrency", "4")
        assert rerun.returncode == 0, rerun.stderr
        assert f"resuming: {len(written)} of {total} lines already answered" in rerun.stderr
        assert_each_id_once(output, total)


@pytest.mark.hostile("batch: the output folder is read-only; one line, exit 2, nothing sent")
def test_read_only_output_folder_is_one_line(tmp_path, vlmserve_cmd, slow_sim) -> None:
    input_path = write_input(tmp_path / "in.jsonl", [request_line(index) for index in range(3)])
    with tmpfs(tmp_path / "ro", "64k") as disk:
        remount(disk, "ro")
        done = run_batch(vlmserve_cmd, input_path, disk / "out.jsonl", slow_sim.base_url)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert error_lines(done.stderr) == [
        f"error: --output: cannot create the lock file {disk / 'out.jsonl.lock'} (Read-only file system); "
        "pick an --output in a writable folder"
    ]
