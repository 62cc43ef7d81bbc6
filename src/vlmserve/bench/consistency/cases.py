"""What the consistency check sends: the checked requests, and the filler load around them.

The checked set is fixed by the seed, so the alone run and the loaded run send byte-identical
bodies: any difference in the answers comes from the server, not from the check.
- Text cases: distinct prompts, each asked once.
- Image cases: one question, each with its own synthetic image (distinct content). If the
  server answers them differently alone but identically under load, an image was confused
  with another (the signature of a multimodal cache returning the wrong entry).
Filler requests only make load: their answers are not compared, and they ask for longer
answers than the checked ones so they stay in flight around them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from vlmserve.bench.workloads.images import image_content, synthetic_image_url

IMAGE_QUESTION = "Describe this image in one sentence. What colours and shapes do you see?"
"""The one question every image case asks (only the image differs)."""

_WORDS = (
    "river", "market", "engine", "garden", "signal", "harbor", "winter", "copper", "lantern", "meadow",
    "orbit", "canyon", "violin", "pepper", "glacier", "tunnel", "bridge", "feather", "planet", "marble",
    "forest", "thunder", "compass", "silver", "island", "candle", "desert", "rocket", "velvet", "falcon",
)  # fmt: skip
_TASKS = (
    "Write a short story that mentions", "List three facts about", "Explain in simple words how",
    "Give a one-line definition of", "Describe a day involving", "Compose a haiku about",
)  # fmt: skip


@dataclass(frozen=True)
class CheckedCase:
    """One request whose answer is compared between the alone run and the loaded run."""

    case_id: str
    kind: str
    """"text" or "image"."""
    messages: list[dict[str, Any]]
    question: str
    """The text part (image cases share it)."""


@dataclass(frozen=True)
class CaseSet:
    """The checked requests and the filler prompts of one check (fixed by the seed)."""

    checked: list[CheckedCase]
    fillers: list[list[dict[str, Any]]]


def _sentence(rng: random.Random, index: int) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 8)))
    return f"{rng.choice(_TASKS)} {words} (item {index})."


def build_cases(seed: int, num_text: int, num_image: int, image_size: tuple[int, int], num_fillers: int) -> CaseSet:
    """The checked text and image cases and `num_fillers` distinct filler prompts."""
    rng = random.Random(f"consistency:{seed}")
    checked: list[CheckedCase] = []
    for index in range(num_text):
        text = _sentence(rng, index)
        checked.append(CheckedCase(f"text-{index}", "text", [{"role": "user", "content": text}], text))
    for index in range(num_image):
        url = synthetic_image_url(random.Random(f"consistency:{seed}:image:{index}"), image_size, "png")
        content = image_content(IMAGE_QUESTION, [url])
        checked.append(CheckedCase(f"image-{index}", "image", [{"role": "user", "content": content}], IMAGE_QUESTION))
    fillers = [[{"role": "user", "content": "Filler: " + _sentence(rng, index)}] for index in range(num_fillers)]
    return CaseSet(checked, fillers)


def request_body(model: str, messages: list[dict[str, Any]], max_tokens: int, token_detail: bool) -> dict[str, Any]:
    """A temperature-0 chat request; with `token_detail`, asking for token ids and logprobs
    (vLLM's `return_token_ids`, OpenAI's `logprobs`) so answers compare token by token."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if token_detail:
        body["logprobs"] = True
        body["return_token_ids"] = True
    return body
