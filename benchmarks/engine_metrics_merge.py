"""What the gateway's `GET /admin/engine-metrics` costs: merging replicas' /metrics pages
(prometheus_text.merge_pages), and the event loop's lag while that merge runs in a thread.

Pages are vLLM-shaped: the sim engine's own page (prometheus_client, as vLLM writes it) plus
histogram families of 40 buckets each, until a page is `--page-kb` long (vLLM's is about 100-300 kB).
Printed: CPU ms per page merged (median of `--repeats`), and how late a 1 ms sleep on the event
loop wakes up (p50, p99, max) while `--replicas` pages are merged by asyncio.to_thread (as the
gateway does) against the same with no merge running: the GIL the two threads share is the cost.

    .venv/bin/python benchmarks/engine_metrics_merge.py [--replicas 4] [--page-kb 250] [--repeats 20]
    .venv/bin/python benchmarks/engine_metrics_merge.py --lines-per-gil-release 1000000000   # no release
    .venv/bin/python benchmarks/engine_metrics_merge.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time

from _smoke import parse_args
from prometheus_client import generate_latest

from vlmserve import prometheus_text
from vlmserve.engines.sim.metrics import EngineMetrics
from vlmserve.prometheus_text import merge_pages


def vllm_shaped_page(kilobytes: int) -> bytes:
    """The sim engine's page, padded with 40-bucket histogram families to about `kilobytes` kB."""
    page = generate_latest(EngineMetrics("Qwen/Qwen2.5-VL-7B-Instruct").registry).decode()
    labels = 'engine="0",model_name="Qwen/Qwen2.5-VL-7B-Instruct"'
    family = 0
    while len(page) < kilobytes * 1000:
        name = f"vllm:padding_{family}_seconds"
        page += f"# HELP {name} Padding histogram.\n# TYPE {name} histogram\n" + "".join(
            f'{name}_bucket{{{labels},le="{0.001 * 2**b:g}"}} {b * 17.0}\n' for b in range(40)
        )
        page += f"{name}_sum{{{labels}}} 12.5\n{name}_count{{{labels}}} 680.0\n"
        family += 1
    return page.encode()


async def loop_lag_ms(duration_s: float, work: asyncio.Future | None) -> list[float]:
    """How late a 1 ms sleep wakes up, in ms, for `duration_s` (or until `work` is done)."""
    lags: list[float] = []
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end and (work is None or not work.done()):
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - started - 0.001) * 1000)
    return lags


def summary(lags: list[float]) -> str:
    ordered = sorted(lags)

    def rank(q: float) -> float:  # nearest rank
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return f"p50 {rank(0.5):.2f} ms, p99 {rank(0.99):.2f} ms, max {ordered[-1]:.2f} ms ({len(ordered)} sleeps)"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--page-kb", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--lines-per-gil-release",
        type=int,
        default=prometheus_text.LINES_PER_GIL_RELEASE,
        help="the merge's GIL release interval (a huge number: never, as before it had one)",
    )
    args = parse_args(parser, replicas=2, page_kb=20, repeats=2)
    prometheus_text.LINES_PER_GIL_RELEASE = args.lines_per_gil_release
    page = vllm_shaped_page(args.page_kb)
    pages = [(f"http://10.0.0.{i}:8000", page) for i in range(args.replicas)]
    lines = page.count(b"\n")
    print(f"{args.replicas} page(s) of {len(page) / 1000:.0f} kB, {lines} lines each")

    cpu: list[float] = []
    for _ in range(args.repeats):
        started = time.process_time()
        merged = merge_pages(pages, "replica")
        cpu.append((time.process_time() - started) * 1000 / args.replicas)
    print(
        f"merge: {statistics.median(cpu):.1f} ms CPU per page (median of {args.repeats}); merged page {len(merged) / 1000:.0f} kB"
    )

    idle = await loop_lag_ms(1.0 if not args.smoke else 0.2, None)
    print(f"event loop, nothing merging: 1 ms sleep late by {summary(idle)}")
    merging: list[float] = []
    for _ in range(args.repeats):
        work = asyncio.ensure_future(asyncio.to_thread(merge_pages, pages, "replica"))
        merging += await loop_lag_ms(10.0, work)
        await work
    print(f"event loop, merging in a thread: 1 ms sleep late by {summary(merging)}")


if __name__ == "__main__":
    asyncio.run(main())
