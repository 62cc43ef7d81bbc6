"""Many-adapter traffic (`bench --lora-adapters`): each conversation is sent to one LoRA adapter.

A service with one adapter per clinic or per language sees skewed popularity: a few adapters take
most requests and a long tail is used now and then, which is what stresses an engine's adapter
slots (`max_loras`) and its adapter cache. Popularity is uniform or Zipf (rank r drawn with weight
1 / r^skew, in the order the adapters are listed); `lora_base_share` of the conversations go to the
base model (the run's --model). The draw is per conversation (a user session stays with its
adapter) from a generator seeded by the run's seed and the conversation's id, so a seed reproduces
the run and a repeated conversation keeps its adapter. Figures per adapter: results.adapters.
"""

from __future__ import annotations

import random

from vlmserve.bench.workloads import Conversation
from vlmserve.errors import UserError
from vlmserve.spec import LoadSpec

EMBEDDED_ADAPTERS_PREFIX = "embedded:"
"""`--lora-adapters embedded:8`: the embedded model's first eight adapters, by their served names."""


def parse_lora_adapters(text: str | None) -> list[str] | None:
    """'a,b,c' or 'embedded:N' as the adapter list; one line naming the flag otherwise."""
    if text is None:
        return None
    if text.startswith(EMBEDDED_ADAPTERS_PREFIX):
        from vlmserve.engines.embedded_adapters import MAX_EMBEDDED_ADAPTERS, adapter_name

        count = text.removeprefix(EMBEDDED_ADAPTERS_PREFIX)
        if not count.isdigit() or not 1 <= int(count) <= MAX_EMBEDDED_ADAPTERS:
            raise UserError(f"--lora-adapters '{text}': write embedded:N with N from 1 to {MAX_EMBEDDED_ADAPTERS}")
        return [adapter_name(index) for index in range(int(count))]
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise UserError(f"--lora-adapters '{text[:80]}': give adapter names separated by commas (a,b,c) or embedded:N")
    return names


def popularity(load: LoadSpec) -> list[float]:
    """Each listed adapter's weight (not normalised): 1 each, or 1 / rank^skew for Zipf."""
    adapters = load.lora_adapters or []
    if load.lora_popularity == "uniform":
        return [1.0] * len(adapters)
    return [1.0 / (rank + 1) ** load.lora_skew for rank in range(len(adapters))]


def assign_adapters(conversations: list[Conversation], load: LoadSpec) -> None:
    """Give every turn of every conversation its adapter (in place); nothing without --lora-adapters."""
    if not load.lora_adapters:
        return
    weights = popularity(load)
    for conversation in conversations:
        rng = random.Random(f"{load.seed}:adapter:{conversation.conversation_id}")
        base = rng.random() < load.lora_base_share
        adapter = None if base else rng.choices(load.lora_adapters, weights)[0]
        for turn in conversation.turns:
            turn.adapter = adapter
