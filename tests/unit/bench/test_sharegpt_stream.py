"""The ShareGPT reader's own item builder (flat events, bounded depth) gives what json.loads gives."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from vlmserve.bench.workloads.sharegpt import _stream_items


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["dict", "list", "str", "int", "float", "bool", "null"] if depth < 5 else ["str", "int", "null"])
    if kind == "dict":
        return {f"k{index}": random_value(rng, depth + 1) for index in range(rng.randint(0, 4))}
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {"str": "s [{\\\"", "int": rng.randint(-5, 10**12), "float": 2.5, "bool": True, "null": None}[kind]


def test_items_match_json_loads(tmp_path: Path) -> None:
    rng = random.Random(7)
    for case in range(200):
        items = [random_value(rng, 1) for _ in range(rng.randint(0, 6))]
        path = tmp_path / f"{case}.json"
        path.write_text(json.dumps(items))
        skips: Counter[str] = Counter()
        assert list(_stream_items(path, skips)) == list(enumerate(items)) and not skips
