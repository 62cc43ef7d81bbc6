"""How many concurrent streams one sim engine process holds on one core, and how many chunks/s it streams,
while the token timing error (actual − scheduled emission time, measured by the server per chunk)
stays within p99 ≤ 2 ms.

    python benchmarks/sim_engine_capacity.py --mode constant --levels 250,500,1000,1500
    python benchmarks/sim_engine_capacity.py --mode scheduler --levels 250,500,1000,1500
    python benchmarks/sim_engine_capacity.py --smoke    # seconds: checks it still runs

The engine runs pinned to one core (`taskset -c ENGINE_CPU`); the load generator runs in
worker processes pinned to the other core(s). Each level adds streams (ramped, so prefills do
not all land in one step), lets them settle, resets the server's timing recorder, then counts
chunks at the clients for the measurement window and reads /debug/timing and /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
from _smoke import parse_args, wait_healthy

MODEL = "bench-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- load generator worker ---------------------------------------------------------------------------
def worker_main(base_url: str, conn: Connection, max_tokens: int) -> None:
    """Hold a requested number of open streams; report chunks received when asked."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_worker(base_url, conn, max_tokens))


async def _worker(base_url: str, conn: Connection, max_tokens: int) -> None:
    import aiohttp

    state = {"chunks": 0, "open": 0, "errors": 0, "completed": 0}
    tasks: list[asyncio.Task[None]] = []
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Stream a long answer about dental radiographs please."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=False), timeout=aiohttp.ClientTimeout(total=None)
    )

    async def stream_forever() -> None:
        while True:
            try:
                async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
                    state["open"] += 1
                    try:
                        async for data in response.content.iter_any():
                            state["chunks"] += data.count(b"data: {")
                    finally:
                        state["open"] -= 1
                state["completed"] += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                state["errors"] += 1
                await asyncio.sleep(0.1)

    loop = asyncio.get_running_loop()
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command[0] == "streams":
            target, ramp_s = command[1], command[2]
            to_add = max(0, target - len(tasks))
            for index in range(to_add):
                tasks.append(loop.create_task(stream_forever()))
                if ramp_s > 0 and to_add > 1:
                    await asyncio.sleep(ramp_s / to_add)
            conn.send(("ok",))
        elif command[0] == "report":
            conn.send(("report", dict(state)))
        elif command[0] == "stop":
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await session.close()
            conn.send(("stopped",))
            return


# -- driver -----------------------------------------------------------------------------------------
def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_engine(args: argparse.Namespace, port: int, log_path: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vlmserve", "engine", "sim", "--port", str(port), "--model", MODEL, "--seed", "1"]
    argv += ["--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "16384", "--num-kv-blocks", "400000"]
    if args.mode == "constant":
        argv += ["--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)]
    else:
        argv += ["--profile", args.profile]
    if shutil.which("taskset"):
        argv = ["taskset", "-c", args.engine_cpu, *argv]
    if args.engine_priority == "realtime":
        argv = ["chrt", "-f", "10", *argv]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(f"http://127.0.0.1:{port}/health", process, log_path=log_path)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("constant", "scheduler"), default="constant")
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=100.0)
    parser.add_argument("--profile", default="h100-8b", help="scheduler mode: the step-cost profile")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="engine's running-batch cap; streams beyond it wait in the queue "
        "(default: 256, vLLM's default, in scheduler mode; 8192 in constant mode)",
    )
    parser.add_argument("--levels", default="250,500,1000,1500", help="concurrent streams per level")
    parser.add_argument("--workers", type=int, default=2, help="load generator processes")
    parser.add_argument("--engine-cpu", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument(
        "--engine-priority",
        choices=("normal", "realtime"),
        default="normal",
        help="realtime runs the engine under SCHED_FIFO (chrt -f 10, needs root): on a shared, "
        "loaded machine this approximates having the core to itself",
    )
    parser.add_argument("--ramp-s", type=float, default=3.0)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--measure-s", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--json-out", type=Path)
    args = parse_args(
        parser, levels="4,8", workers=1, ttft_ms=5.0, itl_ms=5.0, ramp_s=0.1, settle_s=0.3, measure_s=0.5, max_tokens=64
    )
    levels = [int(level) for level in args.levels.split(",")]
    if args.max_num_seqs is None:
        args.max_num_seqs = 256 if args.mode == "scheduler" else 8192

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = Path(f"/tmp/sim-capacity-{port}.log")
    engine = start_engine(args, port, log_path)
    import psutil

    engine_ps = psutil.Process(engine.pid)
    engine_children = engine_ps.children(recursive=True)
    engine_python = engine_children[0] if engine_children else engine_ps

    workers: list[tuple[mp.Process, Connection]] = []
    client_cpus = {int(cpu) for cpu in args.client_cpus.split(",")}
    for _ in range(args.workers):
        parent_conn, child_conn = mp.Pipe()
        process = mp.Process(target=worker_main, args=(base_url, child_conn, args.max_tokens), daemon=True)
        process.start()
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(process.pid, client_cpus)
        workers.append((process, parent_conn))

    def ask_all(command: tuple) -> list[tuple]:
        for _, conn in workers:
            conn.send(command)
        return [conn.recv() for _, conn in workers]

    rows = []
    try:
        for level in levels:
            per_worker = -(-level // args.workers)
            ask_all(("streams", per_worker, args.ramp_s))
            time.sleep(args.settle_s)
            httpx.get(f"{base_url}/debug/timing?reset=1", timeout=60)
            before = [reply[1] for reply in ask_all(("report",))]
            engine_python.cpu_percent(None)
            started = time.monotonic()
            time.sleep(args.measure_s)
            after = [reply[1] for reply in ask_all(("report",))]
            elapsed = time.monotonic() - started
            cpu = engine_python.cpu_percent(None)
            timing = httpx.get(f"{base_url}/debug/timing", timeout=60).json()
            metrics = httpx.get(f"{base_url}/metrics", timeout=60).text
            chunks = sum(a["chunks"] - b["chunks"] for a, b in zip(after, before))
            row = {
                "target_streams": level,
                "open_streams_client": sum(a["open"] for a in after),
                "running_server": _metric(metrics, "vllm:num_requests_running"),
                "chunks_per_s_client": round(chunks / elapsed, 1),
                "engine_cpu_percent": round(cpu, 1),
                "timing_p50_ms": timing["p50_ms"],
                "timing_p99_ms": timing["p99_ms"],
                "timing_p999_ms": timing["p999_ms"],
                "timing_max_ms": timing["max_ms"],
                "chunks_timed": timing["chunks"],
                "client_errors": sum(a["errors"] for a in after),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        try:
            ask_all(("stop",))
        except Exception:
            pass
        for process, _ in workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        engine.terminate()
        try:
            engine.wait(timeout=10)
        except subprocess.TimeoutExpired:
            engine.kill()

    good = [row for row in rows if row["timing_p99_ms"] is not None and row["timing_p99_ms"] <= 2.0]
    best = max(good, key=lambda row: row["chunks_per_s_client"]) if good else None
    summary = {
        "mode": args.mode,
        "timing": f"ttft={args.ttft_ms}ms itl={args.itl_ms}ms" if args.mode == "constant" else f"profile={args.profile}",
        "max_num_seqs": args.max_num_seqs,
        "engine_priority": args.engine_priority,
        "load_average": os.getloadavg(),
        "rows": rows,
        "best_level_within_p99_2ms": best,
        "cpu": os.cpu_count(),
    }
    print("\n| streams (client open / server running) | chunks/s | engine CPU % | timing error p50 / p99 / p99.9 / max (ms) |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['open_streams_client']} / {int(row['running_server'])} | {row['chunks_per_s_client']:,.0f} | "
            f"{row['engine_cpu_percent']} | {row['timing_p50_ms']} / {row['timing_p99_ms']} / {row['timing_p999_ms']} / {row['timing_max_ms']} |"
        )
    if best:
        print(
            f"\nbest level with p99 ≤ 2 ms: {best['open_streams_client']} streams held, "
            f"{int(best['running_server'])} streaming, {best['chunks_per_s_client']:,.0f} chunks/s"
        )
    else:
        print("\nno level kept the timing error within p99 ≤ 2 ms")
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=2))
    if args.smoke and (not rows or any(row["client_errors"] or not row["chunks_timed"] for row in rows)):
        raise SystemExit(f"smoke: a level streamed nothing or had client errors; engine log {log_path}")


if __name__ == "__main__":
    main()
