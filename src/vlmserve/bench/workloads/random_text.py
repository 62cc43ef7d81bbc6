"""random: prompts of an exact token length asking for an exact number of output tokens."""

from __future__ import annotations

import random

from vlmserve.bench.workloads import Conversation, Turn, WorkloadContext
from vlmserve.bench.workloads.text import fit_prompt


def shared_prefix(context: WorkloadContext) -> str:
    """The prefix every prompt starts with (`shared_prefix_len` tokens); '' when none is asked for.

    Drawn from its own seeded generator, so the prompts after it are the same with or without it.
    """
    load = context.load
    if not load.shared_prefix_len:
        return ""
    text, _ = fit_prompt(random.Random(f"prefix:{load.seed}"), context.counter, load.api, load.shared_prefix_len)
    return text


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    load = context.load
    conversations: list[Conversation] = []
    inexact = 0
    prefix = shared_prefix(context)
    prefix_words = len(prefix.split(" ")) if prefix else 0
    for index in range(count):
        text, exact = fit_prompt(context.rng, context.counter, load.api, load.input_len, prefix)
        inexact += not exact
        conversations.append(
            Conversation(
                conversation_id=f"random-{index}",
                workload="random",
                turns=[
                    Turn(
                        content=text,
                        max_tokens=load.output_len,
                        requested_prompt_tokens=load.input_len,
                        requested_output_tokens=load.output_len,
                        shared_words=prefix_words,
                    )
                ],
            )
        )
    if inexact and context.counter.exact:
        context.notices.append(
            f"random: {inexact} of {count} prompts could not be fitted to exactly {load.input_len} tokens "
            "(the closest shorter length is used)"
        )
    elif not context.counter.exact:
        context.notices.append(
            "random: no tokenizer (pass --tokenizer PATH or use a server with /tokenize); "
            "prompt lengths are approximate (one token per word)"
        )
    return conversations
