"""What does shared admission state cost? Rate-limit decisions in Redis vs in the process.

Two measurements, both against a real `redis-server` this script starts (no persistence, on
loopback, a free port):

  decision       one admission decision (request bucket + token budget of one tenant), timed
                 alone: in-process (`Admission.check_rate` on local buckets) vs Redis
                 (`RedisBuckets.admit`, one EVALSHA round trip), sequentially (latency) and at
                 `--decision-concurrency` (decisions per second through one client).
  through the    end-to-end latency of a tiny non-streaming chat request through `vlmserve
  gateway        gateway` to a simulated engine, from a tenant with (never reached) limits:
                 one gateway on in-process state, one with `--state redis://...`. Rounds
                 alternate the two (closed loop, at each of `--concurrency` levels), and the
                 added latency is the median over rounds of the paired p50/p99 differences, so
                 drift in the machine's load hits both sides alike. The gateways' CPU time per
                 request is measured too (two Redis calls per request: admit, and the token
                 settle after the response).

    .venv/bin/python benchmarks/gateway_state.py --decisions 20000 --requests 600 --rounds 6 --concurrency 1,8
    .venv/bin/python benchmarks/gateway_state.py --smoke    # seconds: checks it still runs

Figures use the simulated engine and a Redis on the same machine: they measure the gateway's
admission path and one loopback round trip, not a model and not a network hop to Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
from _smoke import parse_args, wait_healthy

from vlmserve.gateway.admission import Admission, TenantSpec
from vlmserve.gateway.redis_buckets import BucketLimits, RedisBuckets

MODEL = "sim-model"
KEY = "sk-bench"
# Limits the benchmark never reaches, so every request does the whole admission work and passes.
REQUESTS_PER_S = 1e6
TOKENS_PER_MIN = 1e12


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary_ms(values_s: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(values_s, 50) * 1e3,
        "p99_ms": percentile(values_s, 99) * 1e3,
        "mean_ms": statistics.fmean(values_s) * 1e3,
    }


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    process = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(directory / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return process, f"redis://127.0.0.1:{port}/0"
        except redis.RedisError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"redis-server did not start: {(directory / 'redis.log').read_text()[-500:]}") from None
            time.sleep(0.05)


async def decisions_in_process(count: int) -> dict[str, float]:
    admission = Admission([TenantSpec(name="bench", keys=[KEY], requests_per_s=REQUESTS_PER_S, tokens_per_min=TOKENS_PER_MIN)])
    tenant = admission.tenants["bench"]
    took = []
    for _ in range(count):
        started = time.perf_counter()
        await admission.check_rate(tenant, 300)
        took.append(time.perf_counter() - started)
    return summary_ms(took)


async def decisions_in_redis(url: str, count: int, concurrency: int) -> tuple[dict[str, float], float]:
    from redis.asyncio import Redis

    limits = BucketLimits(REQUESTS_PER_S, REQUESTS_PER_S, TOKENS_PER_MIN / 60, TOKENS_PER_MIN)
    client = Redis.from_url(url)
    buckets = RedisBuckets(client)
    try:
        await buckets.admit("warm-up", limits, 1)
        took = []
        for _ in range(count):
            started = time.perf_counter()
            await buckets.admit("bench", limits, 300)
            took.append(time.perf_counter() - started)

        async def worker(share: int) -> None:
            for _ in range(share):
                await buckets.admit("bench", limits, 300)

        started = time.perf_counter()
        await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))
        rate = (count // concurrency) * concurrency / (time.perf_counter() - started)
    finally:
        await client.aclose()
    return summary_ms(took), rate


def start_process(argv: list[str], log_path: Path, health_url: str) -> subprocess.Popen:
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(health_url, process=process, log_path=log_path)
    return process


async def closed_loop(session: aiohttp.ClientSession, base_url: str, requests: int, concurrency: int) -> list[float]:
    """`requests` tiny chat requests, `concurrency` at a time; seconds each, end to end."""
    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    took: list[float] = []
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            async with session.post(base_url + "/v1/chat/completions", data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"{base_url}: status {response.status}: {(await response.text())[:200]}")
            took.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return took


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def through_gateways(gateways: dict[str, tuple[str, int]], args: argparse.Namespace, concurrency: int) -> dict[str, object]:
    """Alternating rounds at one concurrency; `gateways` maps a name to (base URL, pid)."""
    per_round: dict[str, list[dict[str, float]]] = {name: [] for name in gateways}
    cpu: dict[str, float] = {name: 0.0 for name in gateways}
    async with aiohttp.ClientSession() as session:
        for url, _ in gateways.values():  # warm connections and code paths
            await closed_loop(session, url, 20, concurrency)
        for round_index in range(args.rounds):
            order = list(gateways.items())
            for name, (url, pid) in order if round_index % 2 == 0 else reversed(order):
                before = cpu_seconds(pid)
                per_round[name].append(summary_ms(await closed_loop(session, url, args.requests, concurrency)))
                cpu[name] += cpu_seconds(pid) - before
    local, shared = per_round["in-process"], per_round["redis"]
    added = {key: statistics.median(r[key] - l[key] for l, r in zip(local, shared)) for key in ("p50_ms", "p99_ms", "mean_ms")}
    medians = {
        name: {key: statistics.median(r[key] for r in rounds) for key in ("p50_ms", "p99_ms")}
        for name, rounds in per_round.items()
    }
    cpu_us = {name: seconds / (args.rounds * args.requests) * 1e6 for name, seconds in cpu.items()}
    return {"concurrency": concurrency, "medians": medians, "added": added, "gateway_cpu_us_per_request": cpu_us}


async def run(args: argparse.Namespace, work: Path) -> None:
    redis_process, url = start_redis(work)
    processes = [redis_process]
    try:
        local = await decisions_in_process(args.decisions)
        remote, rate = await decisions_in_redis(url, args.decisions, args.decision_concurrency)
        print(
            f"decision, {args.decisions} sequential: in-process p50 {local['p50_ms'] * 1e3:.1f} µs, "
            f"p99 {local['p99_ms'] * 1e3:.1f} µs | Redis p50 {remote['p50_ms'] * 1e3:.0f} µs, "
            f"p99 {remote['p99_ms'] * 1e3:.0f} µs"
        )
        print(f"decision throughput, one Redis client, {args.decision_concurrency} concurrent: {rate:,.0f}/s")

        keys = work / "keys.yaml"
        keys.write_text(
            f"tenants:\n  - name: bench\n    keys: [{KEY}]\n    requests_per_s: {REQUESTS_PER_S:.0f}\n"
            f"    tokens_per_min: {TOKENS_PER_MIN:.0f}\n"
        )
        engine_port, local_port, shared_port = free_port(), free_port(), free_port()
        engine = f"http://127.0.0.1:{engine_port}"
        processes.append(
            start_process(
                [
                    sys.executable,
                    "-m",
                    "vlmserve",
                    "engine",
                    "sim",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(engine_port),
                    "--model",
                    MODEL,
                    "--ttft-ms",
                    "1",
                    "--itl-ms",
                    "1",
                    "--max-num-seqs",
                    "256",
                ],
                work / "engine.log",
                engine + "/health",
            )
        )
        gateway = [
            sys.executable,
            "-m",
            "vlmserve",
            "gateway",
            "--replica",
            engine,
            "--host",
            "127.0.0.1",
            "--keys-file",
            str(keys),
        ]
        local_gateway = start_process(
            [*gateway, "--port", str(local_port)], work / "gateway-local.log", f"http://127.0.0.1:{local_port}/health"
        )
        shared_gateway = start_process(
            [*gateway, "--port", str(shared_port), "--state", url],
            work / "gateway-redis.log",
            f"http://127.0.0.1:{shared_port}/health",
        )
        processes += [local_gateway, shared_gateway]
        gateways = {
            "in-process": (f"http://127.0.0.1:{local_port}", local_gateway.pid),
            "redis": (f"http://127.0.0.1:{shared_port}", shared_gateway.pid),
        }
        results = []
        for concurrency in (int(level) for level in str(args.concurrency).split(",")):
            result = await through_gateways(gateways, args, concurrency)
            results.append(result)
            medians, added, cpu_us = result["medians"], result["added"], result["gateway_cpu_us_per_request"]
            assert isinstance(medians, dict) and isinstance(added, dict) and isinstance(cpu_us, dict)
            print(
                f"through the gateway (sim engine, {args.rounds} rounds x {args.requests} requests, "
                f"concurrency {concurrency}), medians over rounds:"
            )
            for name in ("in-process", "redis"):
                print(
                    f"  {name:<11} e2e p50 {medians[name]['p50_ms']:.2f} ms, p99 {medians[name]['p99_ms']:.2f} ms, "
                    f"gateway CPU {cpu_us[name]:.0f} µs/request"
                )
            print(
                f"  added by Redis (paired per round): p50 {added['p50_ms']:+.2f} ms, p99 {added['p99_ms']:+.2f} ms, "
                f"mean {added['mean_ms']:+.2f} ms"
            )
        if args.json_out:
            Path(args.json_out).write_text(
                json.dumps(
                    {
                        "decision_in_process": local,
                        "decision_redis": remote,
                        "redis_decisions_per_s": rate,
                        "through_gateway": results,
                        "settings": vars(args),
                    },
                    indent=2,
                )
            )
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=20000, help="admission decisions timed per side")
    parser.add_argument("--decision-concurrency", type=int, default=32, help="concurrent decisions for the throughput figure")
    parser.add_argument("--requests", type=int, default=600, help="requests per gateway per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, each running both gateways")
    parser.add_argument("--concurrency", default="1,8", help="closed-loop clients per gateway run (comma-separated levels)")
    parser.add_argument("--json-out", help="write the figures here as JSON")
    args = parse_args(parser, decisions=200, requests=30, rounds=2, concurrency="1,4", decision_concurrency=4)
    with tempfile.TemporaryDirectory(prefix="vlmserve-bench-state-") as work:
        asyncio.run(run(args, Path(work)))


if __name__ == "__main__":
    main()
