"""Request lengths and arrival times for simulated runs, from the same LoadSpec bench uses.

The planner needs only token counts, not text, so it draws lengths directly:
- `random`: exactly `input_len` in, `output_len` out (as `vlmserve bench` asks the server);
- `sharegpt` with a file: the bench's ShareGPT reader, lengths counted in words (the
  bench's no-tokenizer approximation), output = the dataset reply's length;
- `sharegpt` without a file (`dataset_path="builtin"`): log-normal lengths filtered like
  `vllm bench serve` (prompt ≤ 1024, prompt + output ≤ 2048), scaled so the means are
  about 215 tokens in and 195 out — close to the ShareGPT V3 1000-prompt sample as
  Llama-3 and o200k tokenizers count it. An assumption, stated as one;
- `images`: the random text lengths plus `images_per_request` images (or the
  `images_per_request_mix`), each of `image_size` (or drawn from `image_size_mix`) and priced by the
  model's own token rule (vision.tokens); with `image_repeat_rate` R, a request resends an earlier
  image (uniformly among those sent) with probability R, so the frontend's multimodal cache sees
  repeats as the bench's reuse workload produces them.
Arrivals: closed loop has none (the driver sends on completion); open loop draws
Poisson, constant or gamma (burstiness) gaps at `rate`.
"""

from __future__ import annotations

from collections.abc import Callable
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


@dataclass(frozen=True)
class PlannedRequest:
    """One request's lengths (and its open-loop arrival)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    arrival_s: float = 0.0
    images: int = 0
    image_tokens: int = 0
    image_items: tuple[tuple[int, int], ...] = ()
    """(content id, pixels) of each image: what the frontend model preprocesses and caches."""


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


def _sharegpt_filtered(
    normal_in: np.ndarray, normal_out: np.ndarray, mu_in: float, mu_out: float
) -> tuple[np.ndarray, np.ndarray]:
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


def planned_requests(load: LoadSpec, count: int, image_tokens_for: Callable[[int, int], int]) -> list[PlannedRequest]:
    """The requests of a simulated run, in send order; `image_tokens_for(width, height)` prices an image."""
    if load.dataset == "sharegpt":
        if load.dataset_path in (None, BUILTIN_SHAREGPT):
            pairs = builtin_sharegpt_lengths(count, load.seed)
        else:
            pairs = _file_sharegpt_lengths(load.dataset_path, count, load.output_len)
    elif load.dataset in ("random", "images"):
        pairs = [(load.input_len, load.output_len)] * count
    else:
        raise UserError(f"plan: dataset '{load.dataset}' is not simulated; use random, sharegpt or images")
    arrivals = arrival_times(load, count)
    images = _image_items(load, count) if load.dataset == "images" else [()] * count
    planned = []
    for index, (prompt, output) in enumerate(pairs):
        items = images[index]
        image_tokens = sum(image_tokens_for(width, height) for _, (width, height) in items)
        planned.append(
            PlannedRequest(
                index,
                prompt + image_tokens,
                output,
                arrivals[index],
                len(items),
                image_tokens,
                tuple((image_id, width * height) for image_id, (width, height) in items),
            )
        )
    return planned


def _image_items(load: LoadSpec, count: int) -> list[tuple[tuple[int, tuple[int, int]], ...]]:
    """Per request, (image id, (width, height)) of each image; repeats reuse an earlier id and size."""
    rng = np.random.default_rng([load.seed, 1])
    sizes = load.image_size_mix or [(*load.image_size, 1.0)]
    size_weights = np.array([weight for *_, weight in sizes], dtype=float)
    counts = load.images_per_request_mix or {load.images_per_request: 1.0}
    count_values = list(counts)
    count_weights = np.array([counts[value] for value in count_values], dtype=float)
    sent: list[tuple[int, tuple[int, int]]] = []
    result = []
    for _ in range(count):
        wanted = count_values[rng.choice(len(count_values), p=count_weights / count_weights.sum())]
        repeat = load.image_repeat_rate is not None and len(sent) >= wanted > 0 and rng.random() < load.image_repeat_rate
        if repeat:
            chosen = [sent[i] for i in rng.choice(len(sent), size=wanted, replace=False)]
        else:
            chosen = []
            for _ in range(wanted):
                width, height, _weight = sizes[rng.choice(len(sizes), p=size_weights / size_weights.sum())]
                chosen.append((len(sent), (width, height)))
                sent.append(chosen[-1])
        result.append(tuple(chosen))
    return result
