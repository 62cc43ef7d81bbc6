"""Random prompt text of an exact token length, fitted with the token counter.

Words are drawn at random so two prompts share no prefix beyond chance (prefix caching
should not flatter a random workload), then the word count is corrected until the
counter reports exactly the requested prompt length, chat template included.
"""

from __future__ import annotations

import random
from typing import Any

from vlmserve.bench.tokens import TokenCounter

WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week "
    "case point government company number group problem fact be have do say get make go know "
    "take see come think look want give use find tell ask seem feel try leave call good new "
    "first last long great little own other old right big high different small large next early "
    "young important few public bad same able to of in for on with at by from up about into over "
    "after beneath under above the and a that I it not he as you this but his they her she or an "
    "will my one all would there their what so out if who which go me when can like no just him "
    "know take people into year your some could them see other than then now look only come its "
    "also back after use two how our work well even want because any these give most us river "
    "stone paper window garden music light water table road cloud city market forest letter "
    "engine bridge winter summer signal camera doctor lesson planet ocean silver basket"
).split()

MAX_FIT_ROUNDS = 12


def random_words(rng: random.Random, count: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(max(count, 0))]


def chat_messages(text: str, system: str | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return messages


def fit_prompt(rng: random.Random, counter: TokenCounter, api: str, target_tokens: int) -> tuple[str, bool]:
    """Random text whose prompt is exactly `target_tokens` tokens; (text, exact).

    `exact` is False when the counter is approximate or the fit did not converge (a word
    boundary can change the count by two); the closest length not above the target is kept.
    """
    words = random_words(rng, target_tokens)
    best: tuple[int, list[str]] | None = None
    for _ in range(MAX_FIT_ROUNDS):
        text = " ".join(words)
        count = counter.count_prompt(api, text, chat_messages(text) if api == "chat" else None)
        if count == target_tokens:
            return text, counter.exact
        if count < target_tokens and (best is None or count > best[0]):
            best = (count, list(words))
        difference = target_tokens - count
        if difference > 0:
            words.extend(random_words(rng, max(1, difference // 2 if len(words) > 4 else difference)))
        else:
            per_word = count / max(len(words), 1)
            remove = max(1, int(-difference / max(per_word, 1.0)))
            words = words[: max(1, len(words) - remove)]
    if best is None:
        return " ".join(words), False
    return " ".join(best[1]), False
