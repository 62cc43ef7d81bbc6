"""Lines per second of `vlmserve batch` with the built-in runner and with `--runner ray`, same file.

Writes an N-line OpenAI Batch file, starts one sim engine (constant, fast) and one local Ray
head (`ray start --head`, its own temp dir, stopped at the end), then runs the two runners in
alternating rounds on the same file, each into a fresh output, as the CLI a user runs (wall
time of the whole command, Ray's connect and actor start included). Each output is checked:
every custom_id exactly once.

    .venv/bin/python benchmarks/batch_ray.py --lines 20000 --concurrency 32 --rounds 3
    .venv/bin/python benchmarks/batch_ray.py --smoke    # seconds: checks it still runs

The engine is simulated (`vlmserve engine sim`) on the same machine, so the figures compare
the two clients' overhead against a fast server, not a GPU deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _smoke import parse_args, skip
from batch_million import free_port, start_engine, write_input  # same sim engine and input lines


def start_ray_head(port: int, workdir: Path, cpus: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """A head in its own session (stopped by its process group, never `ray stop`, which stops every Ray),
    with its own auth token; returns it and the environment a driver needs to join it."""
    log = workdir / "ray-head.log"
    token = workdir / "ray-token"
    token.write_text(secrets.token_hex(32))
    client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0", **client_env}
    argv = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--num-cpus",
        str(cpus),
        "--include-dashboard=false",
        "--temp-dir",
        str(workdir / "ray"),
        "--disable-usage-stats",
    ]
    head = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if head.poll() is not None or time.monotonic() > deadline:
            stop_group(head)
            raise SystemExit(f"ray head did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)
    return head, client_env


def stop_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def check_output(path: Path, expected: int) -> None:
    seen: set[str] = set()
    lines = 0
    with path.open("rb") as handle:
        for raw in handle:
            lines += 1
            seen.add(json.loads(raw)["custom_id"])
    if lines != expected or len(seen) != expected:
        raise SystemExit(f"output check failed for {path.name}: {lines} lines, {len(seen)} ids, expected {expected}")


def run_once(argv: list[str], output: Path, lines: int, log: Path, env: dict[str, str]) -> float:
    output.unlink(missing_ok=True)
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--output", str(output)], stdout=subprocess.DEVNULL, stderr=log.open("wb"), env={**os.environ, **env}
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:6])}... exited {done.returncode}: {log.read_text(errors='replace')[-2000:]}")
    check_output(output, lines)
    return lines / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (builtin, then ray, each round)")
    parser.add_argument("--ray-workers", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs the local Ray head offers")
    parser.add_argument(
        "--small-lines",
        type=int,
        default=100,
        help="a small file run once per runner: its wall time is mostly the fixed start-up cost",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    args = parse_args(parser, lines=300, concurrency=8, rounds=1, small_lines=20)

    try:
        import ray.data  # noqa: F401

        have_ray = True
    except ImportError:
        have_ray = False
        skip("the ray runner: Ray Data is not installed (pip install 'vlmserve[ray]')")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vlmserve-batch-ray-"))
    workdir.mkdir(parents=True, exist_ok=True)
    input_path, small_path = workdir / "input.jsonl", workdir / "small.jsonl"
    write_input(input_path, args.lines)
    write_input(small_path, args.small_lines)
    engine_port, ray_port = free_port(), free_port()
    engine = start_engine(engine_port, workdir / "engine.log")
    head = None
    rates: dict[str, list[float]] = {"builtin": [], "ray": []}
    small_s: dict[str, float] = {}
    try:
        base = [
            sys.executable,
            "-m",
            "vlmserve",
            "batch",
            str(input_path),
            "--base-url",
            f"http://127.0.0.1:{engine_port}",
            "--concurrency",
            str(args.concurrency),
            "--no-progress",
        ]
        runners = {"builtin": base}
        client_env: dict[str, str] = {}
        if have_ray:
            head, client_env = start_ray_head(ray_port, workdir, args.ray_cpus)
            runners["ray"] = [
                *base,
                "--runner",
                "ray",
                "--ray-address",
                f"127.0.0.1:{ray_port}",
                "--ray-workers",
                str(args.ray_workers),
            ]
        for round_no in range(1, args.rounds + 1):
            for name, argv in runners.items():
                rate = run_once(argv, workdir / f"out-{name}.jsonl", args.lines, workdir / f"{name}.log", client_env)
                rates[name].append(rate)
                print(f"round {round_no}: {name:7s} {rate:,.0f} lines/s", flush=True)
        for name, argv in runners.items():
            small_argv = [small_path if part == str(input_path) else part for part in argv]
            small_s[name] = args.small_lines / run_once(
                [str(part) for part in small_argv],
                workdir / f"small-{name}.jsonl",
                args.small_lines,
                workdir / f"{name}-small.log",
                client_env,
            )
    finally:
        if head is not None:
            stop_group(head)
        engine.terminate()
        engine.wait(timeout=30)

    print(
        f"{args.lines:,} lines, concurrency {args.concurrency}, sim engine on the same machine "
        f"({os.cpu_count()} CPUs, shared); wall time of the whole command"
    )
    for name, values in rates.items():
        if values:
            print(
                f"{name:7s}: median {statistics.median(values):,.0f} lines/s over {len(values)} rounds "
                f"({', '.join(f'{value:,.0f}' for value in values)})"
                + (f"; {args.ray_workers} workers on a {args.ray_cpus}-CPU local head" if name == "ray" else "")
            )
    for name, seconds in small_s.items():
        print(f"{name:7s}: {args.small_lines:,} lines in {seconds:,.1f} s (mostly fixed start-up cost)")
    if os.environ.get("BATCH_BENCH_CLEANUP", "1") == "1":
        for path in workdir.glob("*.jsonl"):
            path.unlink()


if __name__ == "__main__":
    main()
