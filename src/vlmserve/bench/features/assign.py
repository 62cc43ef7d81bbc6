"""Layer the feature workloads onto any dataset's conversations: each request gets its features.

Deterministic per request: the choice of response schema and offered tools is drawn from a
generator seeded with the run's seed and the request's place (conversation id, turn), so a seed
reproduces the run and a fresh variant of a conversation keeps its schema. With both `tools` and
`structured` asked for, each request carries one of the two (a forced tool call and a response
format would both constrain one answer; the sim engine refuses the pair), half and half;
`thinking` goes with every request.
"""

from __future__ import annotations

import random

from vlmserve.bench.features.catalogue import OFFERED_TOOLS_PER_REQUEST, RESPONSE_SCHEMAS, TOOLS
from vlmserve.bench.features.request import FEATURE_NAMES, TOOL_CHOICES, RequestFeatures
from vlmserve.bench.workloads import Conversation
from vlmserve.errors import UserError


def parse_features_flag(text: str | None) -> list[str]:
    """'tools,thinking' as the feature list (in the canonical order); one line naming the flag otherwise."""
    if text is None:
        return []
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UserError(f"--features '{text}': name at least one of {', '.join(FEATURE_NAMES)}")
    unknown = [name for name in names if name not in FEATURE_NAMES]
    if unknown:
        raise UserError(f"--features: unknown feature '{unknown[0]}'; use any of {', '.join(FEATURE_NAMES)} (comma-separated)")
    return [name for name in FEATURE_NAMES if name in names]


def parse_tool_choice_flag(text: str | None, features: list[str]) -> str:
    """--tool-choice as one of named, required, auto (named when not given)."""
    if text is None:
        return "named"
    if text not in TOOL_CHOICES:
        raise UserError(f"--tool-choice '{text}': use one of {', '.join(TOOL_CHOICES)}")
    if "tools" not in features:
        raise UserError("--tool-choice applies to --features tools; add tools to --features")
    return text


def request_features(features: list[str], tool_choice: str, seed: int, where: str) -> RequestFeatures:
    """The features of the request at `where` (conversation id and turn)."""
    rng = random.Random(f"{seed}:features:{where}")
    carried = [name for name in features if name == "thinking"]
    wants_tools, wants_json = "tools" in features, "structured" in features
    if wants_tools and wants_json:
        wants_tools = rng.random() < 0.5
        wants_json = not wants_tools
    response_schema = None
    offered: tuple[str, ...] = ()
    named = None
    if wants_json:
        response_schema = rng.choice(sorted(RESPONSE_SCHEMAS))
        carried.append("structured")
    if wants_tools:
        offered = tuple(rng.sample(sorted(TOOLS), OFFERED_TOOLS_PER_REQUEST))
        named = rng.choice(offered) if tool_choice == "named" else None
        carried.append("tools")
    names = tuple(name for name in FEATURE_NAMES if name in carried)
    return RequestFeatures(names, response_schema, offered, tool_choice if wants_tools else None, named)


def assign_features(conversations: list[Conversation], features: list[str], tool_choice: str, seed: int) -> None:
    """Give every turn of every conversation its features (in place); nothing when no feature is asked for."""
    if not features:
        return
    for conversation in conversations:
        for index, turn in enumerate(conversation.turns):
            turn.features = request_features(features, tool_choice, seed, f"{conversation.conversation_id}:{index}")
