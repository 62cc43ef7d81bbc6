"""What a sweep costs beyond the load it sends, and how long a report takes to write.

Part 1 (against one real sim engine): the same cell run N times directly through the bench's
`run_load`, and N times as cells of a sweep (which adds saving the run to the store and the
manifest write); paired and interleaved, so machine noise hits both alike.
Part 2: rendering the HTML and Markdown report of a large synthetic sweep (4 deployments ×
--report-levels load levels) — the page's size and the seconds it takes.

Run: .venv/bin/python benchmarks/sweep_overhead.py [--repeats 5]
     .venv/bin/python benchmarks/sweep_overhead.py --smoke    # seconds: checks it still runs
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _smoke import parse_args  # noqa: E402

from tests.helpers.synthetic import sweep_results  # noqa: E402
from vlmserve.bench.runner import run_load  # noqa: E402
from vlmserve.bench.target import Target  # noqa: E402
from vlmserve.report.html import render_html  # noqa: E402
from vlmserve.report.markdown import render_markdown  # noqa: E402
from vlmserve.spec import LoadSpec  # noqa: E402
from vlmserve.sweep.manifest import SweepManifest  # noqa: E402
from vlmserve.sweep.runner import run_sweep  # noqa: E402
from vlmserve.sweep.spec import parse_sweep_spec  # noqa: E402

CELL = {"dataset": "random", "input_len": 64, "output_len": 16, "concurrency": 4, "num_requests": 40}


def bench_direct(base_url: str) -> float:
    started = time.perf_counter()
    asyncio.run(run_load(LoadSpec(**CELL), Target(base_url=base_url, model="m"), progress=False))
    return time.perf_counter() - started


def bench_in_sweep(base_url: str, directory: Path) -> float:
    spec = parse_sweep_spec(
        {
            "name": "overhead",
            "warmup_requests": 0,
            "deployments": [{"name": "sim", "endpoint": base_url, "model": "m"}],
            "cells": [{"name": "cell", **CELL}],
        },
        "overhead",
    )
    run_sweep(spec, directory, restart=True, progress=False)
    return float(SweepManifest.load(directory).cell("sim", "cell")["wall_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report-levels", type=int, default=30, help="load levels per deployment in the synthetic report")
    args = parse_args(parser, repeats=1, report_levels=2)
    from tests.helpers.sim import start_sim_engine

    with tempfile.TemporaryDirectory() as home:
        import os

        os.environ["VLMSERVE_HOME"] = home
        with start_sim_engine(model="m", ttft_ms=5, itl_ms=2) as engine:
            direct, swept = [], []
            for index in range(args.repeats):
                direct.append(bench_direct(engine.base_url))
                swept.append(bench_in_sweep(engine.base_url, Path(home) / f"sweep{index}"))
        print(f"cell ({CELL}) x{args.repeats}, interleaved:")
        print(f"  run_load alone : median {statistics.median(direct):.3f} s  (all: {', '.join(f'{v:.2f}' for v in direct)})")
        print(f"  as sweep cell  : median {statistics.median(swept):.3f} s  (all: {', '.join(f'{v:.2f}' for v in swept)})")
        print(f"  sweep / direct : {statistics.median(swept) / statistics.median(direct):.2f}x")

    results = sweep_results(list(range(1, args.report_levels + 1)), {"a": 1.0, "b": 1.5, "c": 2.0, "d": 3.0})
    started = time.perf_counter()
    page = render_html(results)
    html_s = time.perf_counter() - started
    started = time.perf_counter()
    markdown = render_markdown(results)
    md_s = time.perf_counter() - started
    print(
        f"report of {len(results.cells)} cells: HTML {html_s:.2f} s ({len(page) / 1e6:.1f} MB, plotly.js "
        f"embedded), Markdown {md_s * 1000:.0f} ms ({len(markdown) / 1e3:.0f} kB)"
    )


if __name__ == "__main__":
    main()
