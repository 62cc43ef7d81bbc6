"""Regenerate conversations.json: a small, clearly SYNTHETIC ShareGPT-format file for the examples.

No real user wrote these. They are template-built so the sweep examples have multi-turn
chat traffic with varied lengths (a few words to a few hundred) without shipping a real
dataset. Run: python examples/data/make_conversations.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = [
    ("a dental radiograph", "the bitewing shows interproximal shadows on the lower molars"),
    ("a geometry homework picture", "the triangle has one right angle and two equal legs"),
    ("a chest X-ray report", "the lung fields look clear and the heart size is within normal limits"),
    ("a receipt photo", "the total includes tax and a service charge"),
    ("a plant leaf photo", "the leaf has yellow edges and brown spots near the veins"),
    ("a circuit diagram", "the resistors are in series before the capacitor"),
    ("a kitchen floor plan", "the sink is on the window wall and the fridge by the door"),
    ("a handwritten maths solution", "the second line drops a minus sign"),
]
QUESTIONS = [
    "What should I look at first in {topic}?",
    "Can you explain {topic} to a first-year student?",
    "Summarise {topic} in two sentences.",
    "List the three most important details in {topic}.",
    "What would an expert say about {topic}, step by step, with reasons?",
]
FOLLOW_UPS = [
    "Why?",
    "Can you give an example?",
    "Make it shorter.",
    "What could go wrong?",
    "Explain the second point in more detail, please.",
]
FILLER = (
    "This is synthetic example text generated for load testing, not a real conversation. "
    "It pads the message so lengths vary like real chat traffic. "
)


def reply(rng: random.Random, detail: str) -> str:
    return f"Looking at it, {detail}. " + FILLER * rng.choice([0, 1, 2, 4, 8])


def conversation(rng: random.Random, index: int) -> dict:
    topic, detail = rng.choice(TOPICS)
    messages = [
        {"from": "human", "value": rng.choice(QUESTIONS).format(topic=topic) + " " + FILLER * rng.choice([0, 1, 3, 6])},
        {"from": "gpt", "value": reply(rng, detail)},
    ]
    for _ in range(rng.choice([0, 0, 1, 2])):
        messages += [{"from": "human", "value": rng.choice(FOLLOW_UPS)}, {"from": "gpt", "value": reply(rng, detail)}]
    return {"id": f"synthetic-{index:04d}", "synthetic": True, "conversations": messages}


def main() -> None:
    rng = random.Random(2024)
    data = [conversation(rng, index) for index in range(120)]
    path = Path(__file__).with_name("conversations.json")
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(data)} synthetic conversations to {path}")


if __name__ == "__main__":
    main()
