"""Throughput and memory of `vlmserve batch` on a large file through the sim engine.

Writes an N-line OpenAI Batch file (default one million), starts a sim engine in constant
fast mode, runs `vlmserve batch` as a subprocess and samples its resident memory (RSS) twice
a second. Reports lines/s, peak RSS, and RSS at each tenth of the job (flat memory shows as
a flat row). With --time-budget the job is stopped with SIGINT when the budget runs out (a
clean stop); the figures then cover the lines done, and the full-file time is extrapolated
and labelled as such. Finally the output is checked: every custom_id answered exactly once.

    .venv/bin/python benchmarks/batch_million.py --lines 1000000 --concurrency 64
    .venv/bin/python benchmarks/batch_million.py --smoke    # seconds: checks it still runs

The engine is simulated (`vlmserve engine sim`), so lines/s measures the batch client plus
the sim server on the same machine, not a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _smoke import parse_args, wait_healthy

MODEL = "sim-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_input(path: Path, lines: int) -> None:
    with path.open("w") as handle:
        for index in range(lines):
            body = {
                "model": MODEL,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": f"Summarise radiograph report number {index}."}],
            }
            handle.write(
                json.dumps({"custom_id": f"report-{index:07d}", "method": "POST", "url": "/v1/chat/completions", "body": body})
                + "\n"
            )


def start_engine(port: int, log: Path) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "vlmserve",
        "engine",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        MODEL,
        "--ttft-ms",
        "1",
        "--itl-ms",
        "1",
        "--max-num-seqs",
        "1024",
    ]
    engine = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", engine, log_path=log)
    except SystemExit:
        engine.kill()
        raise
    return engine


class LineCounter:
    """Counts newlines in a growing file, reading only what was appended since last time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def update(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                self.lines += chunk.count(b"\n")
                self.offset += len(chunk)
        return self.lines


def check_output(path: Path, expected: int | None) -> tuple[int, int]:
    """(lines, distinct custom_ids); the benchmark may hold a set, the job may not."""
    seen: set[str] = set()
    lines = 0
    with path.open("rb") as handle:
        for raw in handle:
            lines += 1
            seen.add(json.loads(raw)["custom_id"])
    if expected is not None and (lines != expected or len(seen) != expected):
        raise SystemExit(f"output check failed: {lines} lines, {len(seen)} ids, expected {expected}")
    return lines, len(seen)


def measure_resume(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS MB) of rerunning the finished job: the resume scan alone (no engine needed)."""
    argv = [*argv[: argv.index("--base-url") + 1], "http://127.0.0.1:9", *argv[argv.index("--base-url") + 2 :]]
    started = time.monotonic()
    job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process = psutil.Process(job.pid)
    peak = 0
    while job.poll() is None:
        try:
            peak = max(peak, process.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    if job.wait() != 0:
        raise SystemExit(f"resume rerun exited {job.returncode}; expected 0 with nothing left to send")
    return time.monotonic() - started, peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--time-budget", type=float, default=None, help="seconds before a clean stop (SIGINT)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parse_args(parser, lines=200, concurrency=8)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vlmserve-batch-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    input_path, output_path = workdir / "input.jsonl", workdir / "output.jsonl"
    started = time.monotonic()
    write_input(input_path, args.lines)
    print(
        f"input: {args.lines:,} lines, {input_path.stat().st_size / 1e6:,.0f} MB (written in {time.monotonic() - started:.1f} s)"
    )
    output_path.unlink(missing_ok=True)

    port = free_port()
    engine = start_engine(port, workdir / "engine.log")
    job = None
    try:
        argv = [
            sys.executable,
            "-m",
            "vlmserve",
            "batch",
            str(input_path),
            "--output",
            str(output_path),
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--concurrency",
            str(args.concurrency),
            "--no-progress",
        ]
        started = time.monotonic()
        job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(workdir / "batch.log").open("wb"))
        process = psutil.Process(job.pid)
        peak_rss = 0
        rss_by_tenth: dict[int, float] = {}
        stopped_early = False
        counter = LineCounter(output_path)
        while job.poll() is None:
            try:
                rss = process.memory_info().rss
            except psutil.NoSuchProcess:
                break
            peak_rss = max(peak_rss, rss)
            done = counter.update()
            tenth = min(10, done * 10 // args.lines)
            if tenth and tenth not in rss_by_tenth:
                rss_by_tenth[tenth] = rss / 1e6
            if args.time_budget and not stopped_early and time.monotonic() - started > args.time_budget:
                job.send_signal(signal.SIGINT)
                stopped_early = True
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        code = job.wait()
    finally:
        if job is not None and job.poll() is None:
            job.kill()
        engine.terminate()
        engine.wait(timeout=30)

    lines, ids = check_output(output_path, None if stopped_early else args.lines)
    resume = None if stopped_early else measure_resume(argv)
    rate = lines / elapsed
    print(f"batch exit code {code}; answered {lines:,} lines ({ids:,} distinct ids) in {elapsed:,.1f} s")
    print(f"throughput: {rate:,.0f} lines/s (concurrency {args.concurrency}, sim engine, machine shared)")
    print(f"peak RSS of the batch process: {peak_rss / 1e6:,.1f} MB")
    print(
        "RSS (MB) at each tenth of the file: "
        + ", ".join(f"{tenth * 10}%: {mb:,.1f}" for tenth, mb in sorted(rss_by_tenth.items()))
    )
    if resume is not None:
        print(
            f"rerun over the finished job (resume: scan input + output, send nothing): "
            f"{resume[0]:,.1f} s, peak RSS {resume[1]:,.1f} MB"
        )
    if stopped_early:
        print(
            f"EXTRAPOLATED (stopped after {args.time_budget:.0f} s): the full {args.lines:,} lines would take "
            f"about {args.lines / rate / 60:,.1f} min at this rate"
        )
    print(
        f"files in {workdir} (input {input_path.stat().st_size / 1e6:,.0f} MB, output {output_path.stat().st_size / 1e6:,.0f} MB)"
    )
    if os.environ.get("BATCH_BENCH_CLEANUP", "1") == "1":
        input_path.unlink()
        output_path.unlink()


if __name__ == "__main__":
    main()
