"""Request lengths and arrival times for simulated runs, from the same LoadSpec bench uses.

The planner needs only token counts, not text, so it draws lengths directly:
- `random`: exactly `input_len` in, `output_len` out (as `vlmserve bench` asks the server);
- `sharegpt` with a file: the bench's ShareGPT reader, lengths counted in words (the
  bench's no-tokenizer approximation), output = the dataset reply's length;
- `sharegpt` without a file (`dataset_path="builtin"`): log-normal lengths filtered like
  `vllm bench serve` (prompt ≤ 1024, prompt + output ≤ 2048), scaled so the means are
  about 215 tokens in and 195 out — close to the ShareGPT V3 1000-prompt sample as
  Llama-3 and o200k tokenizers count it. An assumption, stated as one;
- `images`: the random text lengths plus `images_per_request` images of the model's
  image-token count (or `image_tokens` when given), on a fraction of the requests
  (`ImageMix.fraction`, the rest are text). Each image is `load.image_size` pixels; with
  probability `ImageMix.repeat_rate` it is one already sent (drawn from the last
  REPEAT_POOL distinct images: a popular working set), else a new one. Digests are what the
  frontend stage's multimodal cache keys on.
Arrivals: closed loop has none (the driver sends on completion); open loop draws
Poisson, constant or gamma (burstiness) gaps at `rate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from vlmserve.errors import UserError
from vlmserve.spec import LoadSpec

BUILTIN_SHAREGPT = "builtin"
SHAREGPT_MEAN_INPUT = 215.0
SHAREGPT_MEAN_OUTPUT = 195.0
SHAREGPT_MAX_PROMPT = 1024
SHAREGPT_MAX_TOTAL = 2048
REPEAT_POOL = 100
"""A repeated image is one of the last this-many distinct images sent."""


@dataclass(frozen=True)
class ImageMix:
    """Which requests carry images and how often an image comes back (planner-only inputs)."""

    fraction: float = 1.0
    """Share of requests that carry images (the images dataset); the rest are text-only."""
    repeat_rate: float = 0.0
    """Chance that an image is one sent before (a cache could serve it)."""

    def validate(self) -> None:
        for flag, value in (("--image-fraction", self.fraction), ("--image-repeat-rate", self.repeat_rate)):
            if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise UserError(f"{flag} must be between 0 and 1, got {value}")


@dataclass(frozen=True)
class PlannedRequest:
    """One request's lengths (and its open-loop arrival)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    arrival_s: float = 0.0
    images: int = 0
    image_tokens: int = 0
    image_digests: tuple[int, ...] = ()
    image_pixels: int = 0
    """Pixels of each of its images."""
    image_repeat: bool | None = None
    """Every image already sent before (the workload's intent); None without images."""


@cache
def _sharegpt_log_means() -> tuple[float, float]:
    """Log-normal μ for input and output such that the filtered means hit the targets."""
    rng = np.random.default_rng(12345)
    normal_in = rng.standard_normal(200_000)
    normal_out = rng.standard_normal(200_000)
    mu_in, mu_out = np.log(SHAREGPT_MEAN_INPUT) - 0.5, np.log(SHAREGPT_MEAN_OUTPUT) - 0.4
    for _ in range(12):
        prompt, output = _sharegpt_filtered(normal_in, normal_out, mu_in, mu_out)
        mu_in += np.log(SHAREGPT_MEAN_INPUT / prompt.mean())
        mu_out += np.log(SHAREGPT_MEAN_OUTPUT / output.mean())
    return float(mu_in), float(mu_out)


def _sharegpt_filtered(normal_in: np.ndarray, normal_out: np.ndarray, mu_in: float, mu_out: float) -> tuple[np.ndarray, np.ndarray]:
    prompt = np.maximum(np.exp(mu_in + 1.0 * normal_in).astype(np.int64), 4)
    output = np.maximum(np.exp(mu_out + 0.9 * normal_out).astype(np.int64), 4)
    keep = (prompt <= SHAREGPT_MAX_PROMPT) & (prompt + output <= SHAREGPT_MAX_TOTAL)
    return prompt[keep], output[keep]


def builtin_sharegpt_lengths(count: int, seed: int) -> list[tuple[int, int]]:
    """`count` (prompt, output) pairs from the built-in ShareGPT-like distribution."""
    mu_in, mu_out = _sharegpt_log_means()
    rng = np.random.default_rng(seed)
    pairs: list[tuple[int, int]] = []
    while len(pairs) < count:
        need = (count - len(pairs)) * 2 + 16
        prompt, output = _sharegpt_filtered(rng.standard_normal(need), rng.standard_normal(need), mu_in, mu_out)
        pairs.extend(zip(prompt.tolist(), output.tolist()))
    return pairs[:count]


def _file_sharegpt_lengths(path: str, count: int, output_len: int) -> list[tuple[int, int]]:
    """(prompt, output) word counts of the first turns in a ShareGPT file, via the bench reader."""
    from vlmserve.bench.workloads.sharegpt import read_conversations

    loaded, _skips = read_conversations(path, limit=count)
    if not loaded:
        raise UserError(f"--dataset-path {path}: no usable conversation in the file")
    pairs = []
    for index in range(count):
        _conversation_id, system, turns = loaded[index % len(loaded)]
        user, reply = turns[0]
        prompt = len(user.split()) + (len(system.split()) if system else 0)
        output = len(reply.split()) if reply else output_len
        pairs.append((max(prompt, 1), max(output, 1)))
    return pairs


def arrival_times(load: LoadSpec, count: int) -> list[float]:
    """Open-loop send times (seconds from the start); all zero for closed loop."""
    if load.rate is None:
        return [0.0] * count
    rng = np.random.default_rng(load.seed)
    if load.arrival == "constant":
        gaps = np.full(count, 1.0 / load.rate)
    elif load.arrival == "gamma":
        shape = load.burstiness
        gaps = rng.gamma(shape, 1.0 / (load.rate * shape), count)
    else:
        gaps = rng.exponential(1.0 / load.rate, count)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def planned_requests(
    load: LoadSpec, count: int, image_tokens_per_image: int, mix: ImageMix | None = None
) -> list[PlannedRequest]:
    """The requests of a simulated run, in send order."""
    if load.dataset == "sharegpt":
        if load.dataset_path in (None, BUILTIN_SHAREGPT):
            pairs = builtin_sharegpt_lengths(count, load.seed)
        else:
            pairs = _file_sharegpt_lengths(load.dataset_path, count, load.output_len)
    elif load.dataset in ("random", "images"):
        pairs = [(load.input_len, load.output_len)] * count
    else:
        raise UserError(f"plan: dataset '{load.dataset}' is not simulated; use random, sharegpt or images")
    mix = mix or ImageMix()
    mix.validate()
    images = load.images_per_request if load.dataset == "images" else 0
    pixels = load.image_size[0] * load.image_size[1]
    arrivals = arrival_times(load, count)
    rng = np.random.default_rng([load.seed, 1729])
    carries = rng.random(count) < mix.fraction if mix.fraction < 1.0 else np.ones(count, dtype=bool)
    digests = _ImageDigests(rng, mix.repeat_rate)
    planned = []
    for index, (prompt, output) in enumerate(pairs):
        if images and carries[index]:
            drawn = [digests.draw() for _ in range(images)]
            image_tokens = images * image_tokens_per_image
            planned.append(PlannedRequest(
                index, prompt + image_tokens, output, arrivals[index], images, image_tokens,
                tuple(digest for digest, _seen in drawn), pixels, all(seen for _digest, seen in drawn),
            ))
        else:
            planned.append(PlannedRequest(index, prompt, output, arrivals[index]))
    return planned


class _ImageDigests:
    """New image digests, or (at `repeat_rate`) one of the last REPEAT_POOL distinct ones."""

    def __init__(self, rng: np.random.Generator, repeat_rate: float) -> None:
        self.rng = rng
        self.repeat_rate = repeat_rate
        self.recent: list[int] = []
        self.next_digest = 1

    def draw(self) -> tuple[int, bool]:
        """(digest, whether it was sent before)."""
        if self.recent and self.repeat_rate > 0 and self.rng.random() < self.repeat_rate:
            return self.recent[int(self.rng.integers(len(self.recent)))], True
        digest = self.next_digest
        self.next_digest += 1
        self.recent.append(digest)
        if len(self.recent) > REPEAT_POOL:
            self.recent.pop(0)
        return digest, False
