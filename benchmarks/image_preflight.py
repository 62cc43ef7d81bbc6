"""CPU cost of the gateway's image preflight per image, by size and format, and what each step costs.

Configurations, timed side by side in rounds (order rotated each round), CPU time of this process:
- `check`: what every image costs at the gateway: base64 decode, header probe, content digest,
  the per-model token estimate (ImagePreflight.run without downscaling);
- `check+downscale`: the same with `--image-downscale-max-side 512` (decode, resize, re-encode, in
  the gateway's image worker processes, whose CPU time is counted with this process's);
- `full decode` (reference, not something the gateway does): base64 decode and a full PIL decode,
  what checking the size by decoding would cost instead of reading the header.
Images are smooth gradients with noise (JPEG at quality 90, PNG), so sizes are realistic.

    .venv/bin/python benchmarks/image_preflight.py [--rounds 5] [--markdown FILE]
    .venv/bin/python benchmarks/image_preflight.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import io
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from _smoke import parse_args
from PIL import Image

from vlmserve.media.preflight import ImageLimits, ImagePreflight
from vlmserve.vision.probe import decode_base64, split_data_url
from vlmserve.vision.tokens import PixelGrid

LIMITS = ImageLimits(max_image_bytes=64 * 1024 * 1024, max_image_pixels=100_000_000, max_images_per_request=16)


def photo(width: int, height: int, image_format: str, rng: random.Random) -> str:
    """A data URL of a gradient with a little noise: compresses like a photo, not like flat colour or pure noise."""
    base = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    noise = Image.frombytes("L", (width // 4 or 1, height // 4 or 1), rng.randbytes((width // 4 or 1) * (height // 4 or 1)))
    image = Image.blend(base, noise.resize((width, height)).convert("RGB"), 0.25)
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **({"quality": 90} if image_format == "JPEG" else {}))
    mime = "image/jpeg" if image_format == "JPEG" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def body(url: str) -> dict:
    return {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is this?"}],
            }
        ],
    }


def configurations() -> dict[str, Callable[[str, int], None]]:
    """Each configuration runs `repeats` images in one event loop (a gateway has one running)."""
    estimator = PixelGrid(family="qwen2_5_vl", is_fallback=False)
    check = ImagePreflight(LIMITS, estimator)
    downscale = ImagePreflight(LIMITS, estimator, downscale_max_side=512)
    assert downscale.pool is not None
    downscale.pool.start()  # the workers' start-up is not an image's cost

    def run(preflight: ImagePreflight) -> Callable[[str, int], None]:
        async def many(url: str, repeats: int) -> None:
            for _ in range(repeats):
                await preflight.run(copy.deepcopy(body(url)))

        return lambda url, repeats: asyncio.run(many(url, repeats))

    def full_decode(url: str, repeats: int) -> None:
        for _ in range(repeats):
            data = decode_base64(split_data_url(url)[1])
            with Image.open(io.BytesIO(data)) as image:
                image.load()

    return {"check": run(check), "check+downscale": run(downscale), "full decode": full_decode}


def cpu_s() -> float:
    """CPU time of this process (its threads included) and of its live child processes (the image workers)."""
    total = time.process_time()
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def cpu_ms(action: Callable[[str, int], None], url: str, repeats: int) -> float:
    """CPU time per image: this process, its threads and the image worker processes."""
    started = cpu_s()
    action(url, repeats)
    return (cpu_s() - started) * 1000 / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="images per configuration per round")
    parser.add_argument("--markdown", type=Path)
    args = parse_args(parser, rounds=1, repeats=1)
    rng = random.Random(0)
    sizes = [(256, 256), (1024, 1024)] if args.smoke else [(256, 256), (1024, 1024), (1920, 1080), (4000, 3000)]
    configs = configurations()
    rows = []
    for width, height in sizes:
        for image_format in ("JPEG", "PNG"):
            url = photo(width, height, image_format, rng)
            kib = len(url) * 3 / 4 / 1024
            samples: dict[str, list[float]] = {name: [] for name in configs}
            for round_index in range(args.rounds):
                names = list(configs)
                names = names[round_index % len(names) :] + names[: round_index % len(names)]
                for name in names:
                    samples[name].append(cpu_ms(configs[name], url, args.repeats))
            medians = {name: statistics.median(values) for name, values in samples.items()}
            rows.append((f"{width}x{height}", image_format, kib, medians))
            print(
                f"{width}x{height} {image_format:4s} {kib:8.0f} KiB  "
                + "  ".join(f"{name} {value:7.2f} ms" for name, value in medians.items()),
                flush=True,
            )
    lines = [
        "| image | format | size (KiB) | check (ms CPU) | check + downscale to 512 (ms CPU) | full decode, for reference (ms CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for size, image_format, kib, medians in rows:
        lines.append(
            f"| {size} | {image_format} | {kib:.0f} | {medians['check']:.2f} | {medians['check+downscale']:.2f} | "
            f"{medians['full decode']:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.markdown and not args.smoke:
        with open(args.markdown, "a") as out:
            out.write(table + "\n")


if __name__ == "__main__":
    main()
