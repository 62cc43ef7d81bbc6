"""Random prompt text of an exact token length, fitted with the token counter.

Words are drawn at random so two prompts share no prefix beyond chance (prefix caching
should not flatter a random workload), then the word count is corrected until the
counter reports exactly the requested prompt length, chat template included.
"""

from __future__ import annotations

import random

from vlmserve.bench.tokens import TokenCounter
from vlmserve.json_types import JSONObject

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

MAX_COARSE_ROUNDS = 8
MAX_FINE_STEPS = 60
FILLERS = tuple("abcdefghijklmnopqrstuvwxyz") + ("is", "to", "of", "in", "on", "at", "by", "we", "it", "no")
"""Short pieces tried one at a time to land on the exact length once the text is close."""


def random_words(rng: random.Random, count: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(max(count, 0))]


def chat_messages(text: str, system: str | None = None) -> list[JSONObject]:
    messages: list[JSONObject] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return messages


def fit_prompt(rng: random.Random, counter: TokenCounter, api: str, target_tokens: int, prefix: str = "") -> tuple[str, bool]:
    """Random text whose prompt is exactly `target_tokens` tokens; (text, exact).

    `prefix` (a shared prefix) starts the text unchanged and counts toward the target;
    only the random words after it are fitted.

    A coarse pass scales the word count by the measured tokens per word; a fine pass
    drops words until the prompt fits, then appends short pieces that keep it within the
    target until it is exact. `exact` is False when the counter is approximate or no
    piece lands exactly (the closest length not above the target is kept).
    """

    head = [prefix] if prefix else []

    def measure(words: list[str]) -> int:
        text = " ".join([*head, *words])
        return counter.count_prompt(api, text, chat_messages(text) if api == "chat" else None)

    words = random_words(rng, max(target_tokens - (measure([]) if prefix else 0), 1))
    count = measure(words)
    for _ in range(MAX_COARSE_ROUNDS):
        difference = target_tokens - count
        if abs(difference) <= 2:
            break
        per_word = max(count / max(len(words), 1), 1.0)
        change = int(difference / per_word) or (1 if difference > 0 else -1)
        words = words + random_words(rng, change) if change > 0 else words[: max(1, len(words) + change)]
        count = measure(words)
    steps = 0
    while count > target_tokens and len(words) > 1 and steps < MAX_FINE_STEPS:
        words.pop()
        count = measure(words)
        steps += 1
    fillers = list(FILLERS)
    rng.shuffle(fillers)
    while count < target_tokens and steps < MAX_FINE_STEPS:
        neutral: str | None = None  # a piece that adds text but no token yet (merges with the next)
        for piece in fillers:
            steps += 1
            longer = measure([*words, piece])
            if count < longer <= target_tokens:
                words.append(piece)
                count = longer
                break
            if longer == count and neutral is None:
                neutral = piece
            if steps >= MAX_FINE_STEPS:
                break
        else:
            if neutral is None:
                break  # no piece fits any more
            words.append(neutral)
    return " ".join([*head, *words]), counter.exact and count == target_tokens


def freshen_text(text: str, rng: random.Random, keep_words: int = 1) -> str:
    """The same words in a new order after the first `keep_words`: a prompt the prefix cache has not seen.

    Used when a duration run sends more requests than it prepared: re-fitting a prompt costs
    tokenizer calls, while a reshuffle is cheap enough to do at send time. The words keep
    their tokens (tokenizers split on spaces first), so the prompt keeps its length; the
    first word stays first because it alone has no leading space. A shared prefix is kept
    by keeping its words.
    """
    words = text.split(" ")
    keep = max(keep_words, 1)
    tail = words[keep:]
    rng.shuffle(tail)
    return " ".join(words[:keep] + tail)
