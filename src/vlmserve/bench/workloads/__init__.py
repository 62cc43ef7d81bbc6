"""Workloads decide what each request says; the load strategy decides when it is sent.

Every workload produces `Conversation`s: one or more user `Turn`s. Single-turn workloads
(random, images, trace) make one-turn conversations; ShareGPT keeps the dataset's turns.
`build_conversations` is the one entry point the runner calls.
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vlmserve.bench.features.request import RequestFeatures
from vlmserve.bench.tokens import TokenCounter
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.spec import LoadSpec


@dataclass
class Turn:
    """One user message and how long an answer it asks for."""

    content: str | list[JSONObject]
    """Chat content: text, or OpenAI content parts (text + image_url)."""
    max_tokens: int
    requested_prompt_tokens: int | None = None
    requested_output_tokens: int | None = None
    reference_reply: str | None = None
    """The dataset's answer, used as history when replaying with dataset replies."""
    image_count: int = 0
    shared_words: int = 0
    """Leading words every request shares on purpose (the shared prefix); a fresh variant keeps them."""
    request_type: str = "text"
    """text, image, multi-image, video or audio: the key of per-type figures and SLOs."""
    image_repeat: bool | None = None
    """True when every image was sent earlier in the run, False when one is new, None without images."""
    mm_processor_kwargs: JSONObject | None = None
    """Per-request processor options (a vision budget), merged over the run's --mm-processor-kwargs."""
    features: RequestFeatures | None = None
    """Tools, structured output or thinking this request carries (`--features`; bench.features.assign)."""
    adapter: str | None = None
    """The LoRA adapter it is sent to (`--lora-adapters`; bench.adapters); None: the run's model."""

    @property
    def text(self) -> str:
        """The text part (what the completions API receives)."""
        if isinstance(self.content, str):
            return self.content
        return " ".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


@dataclass
class Conversation:
    """A user session: turns sent one after another, each after the previous answer ends."""

    conversation_id: str
    workload: str
    turns: list[Turn]
    system: str | None = None
    arrival_s: float | None = None
    """Trace replay: when the first turn is due, relative to the start of the run."""


@dataclass
class WorkloadContext:
    """What workloads share: the load spec, a seeded RNG, the token counter, and notices."""

    load: LoadSpec
    counter: TokenCounter
    rng: _random.Random
    notices: list[str] = field(default_factory=list)
    """One-line messages for the user (e.g. ShareGPT skips), printed before the run."""


WorkloadBuilder = Callable[[WorkloadContext, int], list[Conversation]]


def _builders() -> dict[str, WorkloadBuilder]:
    from vlmserve.bench.workloads import images, mixed, random_text, sharegpt, trace

    return {
        "random": random_text.build,
        "sharegpt": sharegpt.build,
        "images": images.build,
        "mixed": mixed.build,
        "trace": trace.build,
    }


DATASET_FILE_KIND = {"sharegpt": "a ShareGPT JSON file", "trace": "a JSONL trace"}


def require_dataset_file(path_text: str | None, dataset: str) -> Path:
    """The dataset file, or the one-line error saying what to give instead."""
    path = Path(path_text or "")
    if not path_text or not path.is_file():
        raise UserError(f"--dataset-path {path_text or '(none)'}: no such file; give {DATASET_FILE_KIND[dataset]}")
    return path


def require_image_dir(path_text: str) -> Path:
    path = Path(path_text)
    if not path.is_dir():
        raise UserError(f"--image-dir {path}: no such folder; give a folder of PNG/JPEG images")
    return path


def check_local_inputs(load: LoadSpec) -> None:
    """Fail on missing local files before anything touches the network (existence checks only)."""
    datasets = {load.dataset} | set(load.mix or {})
    for dataset in sorted(datasets & DATASET_FILE_KIND.keys()):
        require_dataset_file(load.dataset_path, dataset)
    if load.image_dir and datasets & {"images", "mixed"}:
        require_image_dir(load.image_dir)


def build_conversations(context: WorkloadContext, count: int) -> list[Conversation]:
    """`count` conversations of the load spec's dataset (fewer only when a file runs out)."""
    builder = _builders().get(context.load.dataset)
    if builder is None:
        raise UserError(f"--dataset {context.load.dataset}: unknown; use random, sharegpt, images, mixed or trace")
    return builder(context, count)


def fresh_variant(conversation: Conversation, seed: int, variant: int) -> Conversation:
    """The conversation with every turn's words reshuffled: its `variant`-th use in a run, unseen by the cache.

    Deterministic in (seed, conversation id, variant), so a seed reproduces the run's prompts.
    Images are kept as they are (an image is content, not a prompt the cache should miss on).
    """
    from vlmserve.bench.workloads.text import freshen_text

    rng = _random.Random(f"{seed}:{conversation.conversation_id}:{variant}")
    turns: list[Turn] = []
    for turn in conversation.turns:
        keep = turn.shared_words
        if isinstance(turn.content, str):
            content: str | list[JSONObject] = freshen_text(turn.content, rng, keep)
        else:
            content = [
                {**part, "text": freshen_text(str(part["text"]), rng, keep)} if part.get("type") == "text" else part
                for part in turn.content
            ]
        turns.append(
            Turn(
                content,
                turn.max_tokens,
                turn.requested_prompt_tokens,
                turn.requested_output_tokens,
                turn.reference_reply,
                turn.image_count,
                turn.shared_words,
                turn.request_type,
                turn.image_repeat,
                turn.mm_processor_kwargs,
                turn.features,
                turn.adapter,
            )
        )
    return Conversation(
        f"{conversation.conversation_id}~{variant}", conversation.workload, turns, conversation.system, conversation.arrival_s
    )


def workload_builder(name: str) -> WorkloadBuilder:
    """The builder for one dataset name (used by the mixed workload)."""
    return _builders()[name]
