"""mixed: a blend of workloads by ratio, e.g. `--mix text:0.7,images:0.3`."""

from __future__ import annotations

from vlmserve.bench.workloads import Conversation, WorkloadContext, workload_builder
from vlmserve.errors import UserError

ALIASES = {"text": "random", "random": "random", "images": "images", "image": "images", "sharegpt": "sharegpt"}


def parse_mix(text: str) -> dict[str, float]:
    """'text:0.7,images:0.3' -> {'random': 0.7, 'images': 0.3}, normalised to sum 1."""
    mix: dict[str, float] = {}
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            continue
        name, sep, weight = part.partition(":")
        name = name.strip().lower()
        if not sep or name not in ALIASES:
            raise UserError(f"--mix: '{part}' is not NAME:WEIGHT with NAME text, images or sharegpt")
        try:
            value = float(weight)
        except ValueError:
            raise UserError(f"--mix: weight '{weight}' of '{name}' is not a number") from None
        if value < 0:
            raise UserError(f"--mix: weight of '{name}' must not be negative")
        mix[ALIASES[name]] = mix.get(ALIASES[name], 0.0) + value
    total = sum(mix.values())
    if not mix or total <= 0:
        raise UserError("--mix: give at least one positive weight, e.g. text:0.7,images:0.3")
    return {name: value / total for name, value in mix.items()}


def build(context: WorkloadContext, count: int) -> list[Conversation]:
    mix = context.load.mix or {"random": 1.0}
    names = list(mix)
    weights = [mix[name] for name in names]
    picks = [context.rng.choices(names, weights)[0] for _ in range(count)]
    pools = {name: iter(workload_builder(name)(context, picks.count(name))) for name in names if picks.count(name)}
    conversations = []
    for name in picks:
        conversation = next(pools[name], None)
        if conversation is not None:
            conversations.append(conversation)
    if len(conversations) < count:
        raise UserError(f"--mix: only {len(conversations)} of {count} requests could be built; check --dataset-path")
    return conversations
