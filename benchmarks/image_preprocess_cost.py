"""What an image costs vLLM's frontend: TTFT of a new image vs the same image again, by size.

One embedded vLLM replica (one core), requests one at a time: for each size, a new JPEG photo-like
image, then the same image with another question (a hit in vLLM's multimodal processor cache, which
skips the processor and the vision encoder). Rounds alternate new and repeated images so drift hits
both. The median of the paired differences (new − repeat) per size is what preprocessing and encoding
cost; a line through (megapixels, saving) gives the per-image and per-megapixel priors that
`vlmserve plan` and `vlmserve engine sim` use (hardware.setup.FRONTEND_PER_IMAGE_MS/_PER_MEGAPIXEL_MS).

    .venv/bin/python benchmarks/image_preprocess_cost.py [--pairs 12] [--sizes 256,512,1024,2048]
    .venv/bin/python benchmarks/image_preprocess_cost.py --smoke   # a sim engine with a set cost stands in
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from _smoke import parse_args, skip
from PIL import Image


def photo_url(size: int, seed: int) -> str:
    rng = random.Random(seed)
    base = Image.linear_gradient("L").resize((size, size)).convert("RGB")
    quarter = max(size // 4, 1)
    noise = Image.frombytes("L", (quarter, quarter), rng.randbytes(quarter * quarter)).resize((size, size)).convert("RGB")
    buffer = io.BytesIO()
    Image.blend(base, noise, 0.3).save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


@contextlib.contextmanager
def engine(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.sim import start_sim_engine

        skip("the embedded vLLM engine: a sim engine with 5 ms + 20 ms/MP of preprocessing stands in")
        with start_sim_engine(
            model="smoke-model", profile="tiny-cpu", mm_preprocess_ms_per_image=5, mm_preprocess_ms_per_megapixel=20
        ) as sim:
            yield sim.base_url, "smoke-model"
        return
    from vlmserve.demo.run import demo_spec
    from vlmserve.deploy.supervisor import Supervisor

    spec = demo_spec(name="bench-preprocess").model_copy(update={"cpu_threads_per_replica": 1})
    workdir = Path(tempfile.mkdtemp(prefix="preprocess-cost-"))
    print(f"starting the embedded vLLM engine on one core (logs under {workdir}) ...", flush=True)
    with Supervisor(spec, state_dir=workdir) as supervisor:
        yield supervisor.replicas[0].plan.url, supervisor.served_model_name


def ttft_ms(client: httpx.Client, base_url: str, model: str, url: str, question: str) -> float:
    body = {
        "model": model,
        "max_tokens": 1,
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]}
        ],
    }
    started = time.perf_counter()
    response = client.post(base_url + "/v1/chat/completions", json=body)
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of saving_ms against megapixels."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=12, help="new/repeat pairs per size")
    parser.add_argument("--sizes", default="256,512,1024,2048", help="square image sides, comma-separated")
    args = parse_args(parser, pairs=2, sizes="256,1024")
    sizes = [int(size) for size in args.sizes.split(",")]
    rows = []
    with engine(args) as (base_url, model), httpx.Client(timeout=300, trust_env=False) as client:
        ttft_ms(client, base_url, model, photo_url(64, 0), "warm up")
        for size in sizes:
            new, repeat, saving = [], [], []
            for pair in range(args.pairs):
                url = photo_url(size, size * 1000 + pair)
                first = ttft_ms(client, base_url, model, url, f"question {pair}: what is this?")
                again = ttft_ms(client, base_url, model, url, f"question {pair}: and the colours?")
                new.append(first)
                repeat.append(again)
                saving.append(first - again)
            megapixels = size * size / 1e6
            rows.append((size, megapixels, statistics.median(new), statistics.median(repeat), statistics.median(saving)))
            print(
                f"{size}x{size}: new {rows[-1][2]:.1f} ms, repeat {rows[-1][3]:.1f} ms, saving {rows[-1][4]:.1f} ms", flush=True
            )
    intercept, slope = fit_line([(mp, saving) for _, mp, _, _, saving in rows])
    engine_name = "sim engine (smoke)" if args.smoke else "embedded vLLM CPU engine, one core"
    print(f"\n{engine_name}, {args.pairs} pairs per size, medians:\n")
    print("| image | TTFT, new image (ms) | TTFT, same image again (ms) | saving, median of pairs (ms) |")
    print("|---|---|---|---|")
    for size, _mp, new_ms, repeat_ms, saving_ms in rows:
        print(f"| {size}x{size} | {new_ms:.1f} | {repeat_ms:.1f} | {saving_ms:.1f} |")
    print(f"\nfit: saving ≈ {intercept:.1f} ms per image + {slope:.1f} ms per megapixel")


if __name__ == "__main__":
    main()
