"""/health latency while the gateway works on hostile images, and the event loop's lag with image work in threads or processes.

Part 1 (the gateway as deployed, in its own process, one sim engine behind it, downscaling on):
16 requests each carrying a 7.8 KB 1-bit 8000x8000 PNG (a "PNG bomb": 64 megapixels, within the
default pixel limit, so it is decoded and resized) and one carrying a 12000x12000 ICO (Pillow's ICO
reader decodes at open) are sent at once, while /health is polled every 10 ms on a kept-alive
connection until the last image request is answered. Printed: /health latency p50, p99 and max, how
many polls were answered in that window, the image requests' statuses, and for reference the same
polling for 2 s before any image is sent (what this machine gives an idle gateway).

Part 2 (`--compare-pools`, in this process): the same resize run 16 times by two threads
(asyncio.to_thread, the GIL shared) and by two worker processes (media/workers.py), while a
task measures how late a 10 ms sleep wakes up: the lag the event loop would add to every request.

    .venv/bin/python benchmarks/image_health_latency.py [--bombs 16] [--compare-pools]
    .venv/bin/python benchmarks/image_health_latency.py --smoke

Run it with PYTHONPATH pointing at another checkout to measure that code (part 1 uses only flags
that existed before the worker pool).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _smoke import parse_args, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.helpers
from tests.helpers.image_bombs import ico_holding_png, one_bit_png  # noqa: E402
from tests.helpers.sim import free_port, sim_engine_argv  # noqa: E402

MODEL = "sim-model"


def image_body(data: bytes, mime: str) -> bytes:
    url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return json.dumps(
        {
            "model": MODEL,
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is this?"}],
                }
            ],
        }
    ).encode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fire_and_poll(base_url: str, bodies: list[bytes]) -> tuple[list[float], list[float], list[int], float]:
    """Poll /health 2 s idle, then send every body at once and poll until all are answered:
    (idle latencies in ms, latencies while the images ran, statuses, window s)."""
    latencies: list[float] = []
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=len(bodies) + 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client, httpx.AsyncClient(timeout=300) as health:

        async def poll(into: list[float], until: asyncio.Event) -> None:
            while not until.is_set():
                started = time.perf_counter()
                await health.get(base_url + "/health")
                into.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(0.01)

        idle: list[float] = []
        idle_over = asyncio.Event()
        asyncio.get_running_loop().call_later(2.0, idle_over.set)
        await poll(idle, idle_over)

        async def post(body: bytes) -> int:
            response = await client.post(
                base_url + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
            )
            return response.status_code

        poller = asyncio.create_task(poll(latencies, done))
        started = time.perf_counter()
        statuses = await asyncio.gather(*(post(body) for body in bodies))
        window = time.perf_counter() - started
        done.set()
        await poller
    return idle, latencies, list(statuses), window


def gateway_under_images(bombs: int, side: int, extra_flags: list[str]) -> None:
    bomb = image_body(one_bit_png(side, side), "image/png")
    ico = image_body(ico_holding_png(int(side * 1.5), int(side * 1.5)), "image/x-icon")
    print(
        f"one PNG bomb: {len(one_bit_png(side, side))} bytes, {side}x{side} 1-bit; the ICO holds "
        f"{int(side * 1.5)}x{int(side * 1.5)}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as log_dir:
        engine_port, port = free_port(), free_port()
        engine_log = Path(log_dir) / "sim.log"
        gateway_log = Path(log_dir) / "gateway.log"
        with engine_log.open("wb") as log:
            engine = subprocess.Popen(
                sim_engine_argv(engine_port, model=MODEL, ttft_ms=5, itl_ms=1), stdout=log, stderr=subprocess.STDOUT
            )
        argv = [
            sys.executable,
            "-m",
            "vlmserve",
            "gateway",
            "--replica",
            f"http://127.0.0.1:{engine_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--image-downscale-max-side",
            "512",
            *extra_flags,
        ]
        with gateway_log.open("wb") as log:
            gateway = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"http://127.0.0.1:{engine_port}/health", engine, log_path=engine_log)
            wait_healthy(f"http://127.0.0.1:{port}/health", gateway, log_path=gateway_log)
            time.sleep(2.0)  # the image workers (if any) are up
            idle, latencies, statuses, window = asyncio.run(fire_and_poll(f"http://127.0.0.1:{port}", [bomb] * bombs + [ico]))
        finally:
            gateway.terminate()
            engine.terminate()
            gateway.wait(30)
            engine.wait(30)
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    print(f"{bombs} PNG bombs + 1 ICO answered in {window:.2f} s; statuses {counts}", flush=True)
    print(
        f"/health idle, for reference: {len(idle)} polls, p50 {statistics.median(idle):.1f} ms, "
        f"p99 {percentile(idle, 0.99):.1f} ms, max {max(idle):.1f} ms",
        flush=True,
    )
    print(
        f"/health while they ran: {len(latencies)} polls, p50 {statistics.median(latencies):.1f} ms, "
        f"p99 {percentile(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms",
        flush=True,
    )
    if any(status >= 500 and status != 503 for status in statuses):
        sys.exit("an image request failed inside the gateway (5xx): see above")


async def loop_lag_ms(run_all: asyncio.Future) -> list[float]:  # type: ignore[type-arg]
    lags: list[float] = []
    while not run_all.done():
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append((time.perf_counter() - started - 0.01) * 1000)
    await run_all
    return lags


def compare_pools(bombs: int, side: int) -> None:
    from vlmserve.media.workers import ImageWorkerPool
    from vlmserve.vision.resize import resized_data_url

    data = one_bit_png(side, side)
    args = (data, "png", 512, 512)

    async def threads() -> list[float]:
        executor = ThreadPoolExecutor(2)
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(
            asyncio.gather(*(loop.run_in_executor(executor, resized_data_url, *args) for _ in range(bombs)))
        )
        try:
            return await loop_lag_ms(work)
        finally:
            executor.shutdown()

    async def processes() -> list[float]:
        pool = ImageWorkerPool(2, budget_s=600)
        pool.start()
        await pool.run(resized_data_url, (one_bit_png(64, 64), "png", 16, 16), pool.budget(), "warm-up")
        await pool.run(resized_data_url, (one_bit_png(64, 64), "png", 16, 16), pool.budget(), "warm-up")
        work = asyncio.ensure_future(
            asyncio.gather(*(pool.run(resized_data_url, args, pool.budget(), "bomb") for _ in range(bombs)))
        )
        try:
            return await loop_lag_ms(work)
        finally:
            pool.close()

    for name, run in (("2 threads", threads), ("2 processes", processes)):
        started = time.perf_counter()
        lags = asyncio.run(run())
        print(
            f"{name:<12} {bombs} resizes in {time.perf_counter() - started:.2f} s; event loop lag over a 10 ms sleep: "
            f"p50 {statistics.median(lags):.1f} ms, max {max(lags):.1f} ms ({len(lags)} samples)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bombs", type=int, default=16, help="PNG bomb requests sent at once")
    parser.add_argument("--side", type=int, default=8000, help="the PNG bomb's side in pixels (the ICO's is 1.5 times it)")
    parser.add_argument("--compare-pools", action="store_true", help="also measure the event loop's lag: threads vs processes")
    parser.add_argument("--gateway-flag", action="append", default=[], help="extra flag for the gateway (repeat)")
    args = parse_args(parser, bombs=3, side=2000, compare_pools=True)
    gateway_under_images(args.bombs, args.side, args.gateway_flag)
    if args.compare_pools:
        compare_pools(args.bombs, args.side)


if __name__ == "__main__":
    main()
