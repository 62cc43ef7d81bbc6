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
    return {"str": 's [{\\"', "int": rng.randint(-5, 10**12), "float": 2.5, "bool": True, "null": None}[kind]


def test_items_match_json_loads(tmp_path: Path) -> None:
    rng = random.Random(7)
    for case in range(200):
        items = [random_value(rng, 1) for _ in range(rng.randint(0, 6))]
        path = tmp_path / f"{case}.json"
        path.write_text(json.dumps(items))
        skips: Counter[str] = Counter()
        assert list(_stream_items(path, skips)) == list(enumerate(items)) and not skips


def test_a_conversation_over_the_byte_limit_is_one_error(tmp_path: Path, monkeypatch) -> None:
    from vlmserve.bench.workloads import sharegpt
    from vlmserve.bounded_read import Limits
    from vlmserve.errors import UserError

    monkeypatch.setattr(sharegpt, "DATASET_ITEM", Limits("conversation", max_bytes=1000, max_items=100))
    path = tmp_path / "long.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "x" * 300_000}]}]))
    try:
        list(_stream_items(path, Counter()))
    except UserError as err:
        assert (
            str(err) == f"{path}: a conversation is over the 1,000-byte limit for a conversation; not a ShareGPT "
            "file, or a damaged one: check --dataset-path"
        )
    else:
        raise AssertionError("the long conversation was read")
