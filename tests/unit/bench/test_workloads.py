"""Workload readers on messy inputs, without a server (words stand in for a tokenizer)."""

from __future__ import annotations

import json
import random

import pytest

from tests.helpers.bench_fixtures import write_sharegpt
from vlmserve.bench.load import arrival_offsets
from vlmserve.bench.tokens import WordCounter
from vlmserve.bench.workloads import WorkloadContext, build_conversations
from vlmserve.bench.workloads.mixed import parse_mix
from vlmserve.bench.workloads.sharegpt import MAX_MESSAGE_CHARS, read_conversations
from vlmserve.bench.workloads.text import fit_prompt
from vlmserve.errors import UserError
from vlmserve.spec import LoadSpec


def context(**load) -> WorkloadContext:
    return WorkloadContext(load=LoadSpec(concurrency=1, num_requests=1, **load), counter=WordCounter(), rng=random.Random(0))


def test_sharegpt_messy_file_loads_every_complete_conversation(tmp_path):
    items = [
        {"id": "ok", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        {"id": "huge", "conversations": [{"from": "human", "value": "x" * (MAX_MESSAGE_CHARS + 1)}]},
        {"id": "odd-start", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "q2"}]},
        {"id": "weird", "conversations": [{"from": "narrator", "value": "?"}]},
        {
            "id": "two-humans",
            "conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}, {"from": "gpt", "value": "c"}],
        },
        {"id": "nolist"},
    ]
    path = write_sharegpt(tmp_path / "messy.json", items, truncate_tail='{"id": "cut", "conv')
    loaded, skips = read_conversations(str(path))
    assert [conversation[0] for conversation in loaded] == ["ok", "odd-start", "two-humans"]
    assert loaded[1][2] == [("q2", None)]  # a reply before any question is dropped; the last question has no reply
    assert loaded[2][2] == [("a\nb", "c")]
    assert dict(skips) == {
        "message too long": 1,
        "unknown speaker": 1,
        "no 'conversations' list": 1,
        "truncated at end of file": 1,
    }


def test_sharegpt_stops_reading_at_limit(tmp_path):
    items = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(50)]
    path = write_sharegpt(tmp_path / "many.json", items)
    loaded, _ = read_conversations(str(path), limit=5)
    assert len(loaded) == 5


def test_sharegpt_dataset_reply_lengths_and_cycling(tmp_path):
    items = [{"id": "a", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "one two three"}]}]
    path = write_sharegpt(tmp_path / "one.json", items)
    conversations = build_conversations(context(dataset="sharegpt", dataset_path=str(path)), 3)
    assert [c.conversation_id for c in conversations] == ["a", "a#2", "a#3"]
    assert conversations[0].turns[0].max_tokens == 3  # the reference reply's length
    fixed = build_conversations(context(dataset="sharegpt", dataset_path=str(path), output_len=7, fixed_output_len=True), 1)
    assert fixed[0].turns[0].max_tokens == 7


def test_fit_prompt_hits_exact_length_with_a_real_counter():
    class CharsCounter:  # a counter where words cost several tokens
        exact = True
        source = "chars"

        def count_prompt(self, api, text, messages):
            return len(text.replace(" ", "")) // 3 + 5

        def count_text(self, text):
            return len(text)

    rng = random.Random(1)
    hits = 0
    for _ in range(20):
        text, exact = fit_prompt(rng, CharsCounter(), "chat", 200)
        length = CharsCounter().count_prompt("chat", text, None)
        assert length <= 200
        hits += exact
    assert hits == 20


def test_arrival_schedules():
    rng = random.Random(0)
    constant = arrival_offsets("constant", 10.0, 1.0, rng, count=5, duration_s=None)
    assert constant == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    poisson = arrival_offsets("poisson", 100.0, 1.0, rng, count=4000, duration_s=None)
    assert poisson[-1] / len(poisson) == pytest.approx(0.01, rel=0.1)
    bursty = arrival_offsets("gamma", 100.0, 0.25, rng, count=4000, duration_s=None)
    gaps = [b - a for a, b in zip(bursty, bursty[1:])]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert mean == pytest.approx(0.01, rel=0.15) and cv > 1.5  # burstier than Poisson (cv 1)
    timed = arrival_offsets("constant", 10.0, 1.0, rng, count=None, duration_s=1.0)
    assert len(timed) == 10


def test_parse_mix():
    assert parse_mix("text:0.7,images:0.3") == pytest.approx({"random": 0.7, "images": 0.3})
    assert parse_mix("text:3, image:1") == pytest.approx({"random": 0.75, "images": 0.25})
    with pytest.raises(UserError, match="at least one positive weight"):
        parse_mix("text:0")


def test_trace_lengths_and_prompt(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"arrival_s": 2.5, "input_length": 5, "output_length": 4})
        + "\n"
        + json.dumps({"arrival_s": 1.0, "prompt": "given words", "output_length": 2})
        + "\n"
    )
    conversations = build_conversations(context(dataset="trace", dataset_path=str(path)), 10)
    assert [c.arrival_s for c in conversations] == [0.0, 1.5]
    assert conversations[0].turns[0].content == "given words" and conversations[0].turns[0].requested_prompt_tokens is None
    assert conversations[1].turns[0].requested_prompt_tokens == 5 and conversations[1].turns[0].max_tokens == 4
