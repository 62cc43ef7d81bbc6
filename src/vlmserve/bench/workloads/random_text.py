"""random: prompts of an exact token length asking for an exact number of output tokens."""

from __future__ import annotations

from vlmserve.bench.workloads import Conversation, Turn, WorkloadContext
from vlmserve.bench.workloads.text import fit_prompt


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    load = context.load
    conversations: list[Conversation] = []
    inexact = 0
    for index in range(count):
        text, exact = fit_prompt(context.rng, context.counter, load.api, load.input_len)
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
