"""Does `vlmserve gateway --workers N` turn more cores into more throughput?

Simulated engines (`vlmserve engine sim`, fast tokens so that the gateway, not the engines, is
the first limit) behind one gateway started with 1, 2, 4 ... workers in turn; the same closed
loop of streamed requests (N concurrent streams) through each. Per worker count it prints the
streamed chunks per second, TTFT p50/p99, and the CPU used by the gateway (all its processes),
the engines and the load generator, in cores, so whichever of them runs out first is visible:
the throughput grows with workers only while the gateway is what is saturated.

    .venv/bin/python benchmarks/gateway_workers.py --workers 1,2,4 --streams 512 --requests 4096
    .venv/bin/python benchmarks/gateway_workers.py --smoke

Figures are from the simulated engine: they measure the gateway and this machine, not a model.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _smoke import parse_args, wait_healthy
from gateway_overhead import MODEL, Route, free_port, run_trial, start_engine  # the same load generator

from vlmserve.bench.client import RequestOptions, build_body, encode_body
from vlmserve.bench.http_stream import ConnectionPool


def start_gateway(engines: list[Route], workers: int, log_dir: Path) -> Route:
    port = free_port()
    argv = [sys.executable, "-m", "vlmserve", "gateway", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    for engine in engines:
        argv += ["--replica", engine.base_url]
    with (log_dir / f"gateway-{workers}w.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    route = Route(f"{workers} worker(s)", f"http://127.0.0.1:{port}", [process])
    wait_healthy(route.base_url + "/health", process=process, timeout_s=120, log_path=log_dir / f"gateway-{workers}w.log")
    return route


def cpu_of(routes: list[Route]) -> float:
    return sum(sum(route.cpu_seconds()) for route in routes)


async def measure(route: Route, engines: list[Route], args: argparse.Namespace) -> dict:
    import random

    rng = random.Random(0)
    options = RequestOptions(model=MODEL, per_chunk_usage=False)
    messages = [{"role": "user", "content": "Describe the radiograph in one line."}]
    low, high = max(1, args.output_tokens // 2), args.output_tokens * 3 // 2
    bodies = [encode_body(build_body(options, rng.randint(low, high), messages=messages)) for _ in range(97)]
    stagger_s = (args.ttft_ms + args.itl_ms * args.output_tokens) / 1000 / args.streams
    pool = ConnectionPool(route.base_url + options.path)
    try:
        await run_trial(pool, route, bodies, min(args.requests, args.streams), args.streams, stagger_s)  # warm-up
        engines_before = cpu_of(engines)
        started = time.perf_counter()
        trial = await run_trial(pool, route, bodies, args.requests, args.streams, stagger_s)
        wall = time.perf_counter() - started
        engines_cpu = (cpu_of(engines) - engines_before) / wall
    finally:
        pool.close()
    return {
        "workers": args.current_workers,
        "chunks_per_s": trial.output_tokens / trial.wall_s,
        "ttft_p50_ms": trial.percentile(0.5),
        "ttft_p99_ms": trial.percentile(0.99),
        "failed": trial.failed,
        "gateway_cpu": trial.proxy_cpu,
        "engines_cpu": engines_cpu,
        "loadgen_cpu": trial.loadgen_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts to try")
    parser.add_argument("--engines", type=int, default=2, help="sim engines behind the gateway")
    parser.add_argument("--streams", type=int, default=512, help="concurrent streams (closed loop)")
    parser.add_argument("--requests", type=int, default=4096, help="requests per worker count")
    parser.add_argument("--ttft-ms", type=float, default=5.0)
    parser.add_argument("--itl-ms", type=float, default=5.0, help="fast tokens: the gateway should be the limit")
    parser.add_argument("--output-tokens", type=int, default=32, help="mean output length (uniform 0.5x..1.5x)")
    parser.add_argument("--json-out", type=Path)
    args = parse_args(parser, workers="1,2", engines=1, streams=4, requests=16, output_tokens=4)
    counts = [int(value) for value in args.workers.split(",") if value.strip()]
    # the engine helper's settings (gateway_overhead.start_engine): no pinning, room for every stream
    args.engine_cpus = ""

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = Path(tempfile.mkdtemp(prefix="gateway-workers-"))
    engines: list[Route] = []
    rows = []
    try:
        for index in range(args.engines):
            engine = start_engine(args, log_dir)
            engine.name = f"engine{index}"
            engines.append(engine)
        print(
            f"{args.engines} sim engine(s) (TTFT {args.ttft_ms} ms, ITL {args.itl_ms} ms), {args.streams} streams, "
            f"{args.requests} requests per worker count, {os.cpu_count()} CPUs; logs in {log_dir}",
            flush=True,
        )
        import uvloop

        for workers in counts:
            gateway = start_gateway(engines, workers, log_dir)
            try:
                args.current_workers = workers
                row = uvloop.run(measure(gateway, engines, args))
            finally:
                gateway.stop()
            rows.append(row)
            print(
                f"workers {workers}: {row['chunks_per_s']:8.0f} chunks/s  TTFT p50 {row['ttft_p50_ms']:7.2f} ms "
                f"p99 {row['ttft_p99_ms']:7.2f} ms  failed {row['failed']}  CPU cores: gateway {row['gateway_cpu']:.2f} "
                f"engines {row['engines_cpu']:.2f} load generator {row['loadgen_cpu']:.2f} (of {psutil.cpu_count()})",
                flush=True,
            )
        base = rows[0]["chunks_per_s"] if rows else 0
        print()
        print(
            f"{'workers':>7} {'chunks/s':>9} {'vs first':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'gw CPU':>7} {'eng CPU':>8} {'gen CPU':>8}"
        )
        for row in rows:
            print(
                f"{row['workers']:>7} {row['chunks_per_s']:>9.0f} {row['chunks_per_s'] / base:>8.2f}x "
                f"{row['ttft_p50_ms']:>7.2f}ms {row['ttft_p99_ms']:>7.2f}ms {row['gateway_cpu']:>7.2f} "
                f"{row['engines_cpu']:>8.2f} {row['loadgen_cpu']:>8.2f}"
            )
        failed = sum(row["failed"] for row in rows)
        if args.smoke and failed:
            raise SystemExit(f"smoke: {failed} requests failed; see the logs in {log_dir}")
        if args.json_out:
            args.json_out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    finally:
        for engine in engines:
            engine.stop()


if __name__ == "__main__":
    main()
