"""bench --lora-adapters: popularity (uniform, Zipf), per-conversation draws, request bodies, per-adapter figures."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from vlmserve.bench.adapters import assign_adapters, parse_lora_adapters
from vlmserve.bench.client import RequestOptions
from vlmserve.bench.load import build_item_bodies
from vlmserve.bench.tokens import WordCounter
from vlmserve.bench.workloads import WorkloadContext, build_conversations
from vlmserve.cli.bench import build_load_spec, option_defaults
from vlmserve.errors import UserError
from vlmserve.results.metrics import summarize
from vlmserve.results.records import RequestRecord
from vlmserve.spec import LoadSpec


def conversations(count: int, **load: object):  # -> (LoadSpec, list[Conversation])
    spec = LoadSpec(concurrency=1, num_requests=count, input_len=16, output_len=4, **load)  # type: ignore[arg-type]
    built = build_conversations(WorkloadContext(load=spec, counter=WordCounter(), rng=random.Random(spec.seed)), count)
    assign_adapters(built, spec)
    return spec, built


def shares(built) -> Counter:  # type: ignore[no-untyped-def]
    return Counter(conversation.turns[0].adapter for conversation in built)


def test_zipf_popularity_is_skewed_by_rank_and_uniform_is_flat() -> None:
    names = parse_lora_adapters("embedded:8")
    assert names == [f"tiny-lora-{index}" for index in range(8)]
    _, zipf = conversations(4000, lora_adapters=names, lora_popularity="zipf", lora_skew=1.2)
    counted = shares(zipf)
    expected_top = 1 / sum(1 / (rank + 1) ** 1.2 for rank in range(8))  # 0.41
    assert abs(counted["tiny-lora-0"] / 4000 - expected_top) < 0.03
    assert counted["tiny-lora-0"] > counted["tiny-lora-1"] > counted["tiny-lora-3"] > counted["tiny-lora-7"]
    _, flat = conversations(4000, lora_adapters=names)
    assert max(shares(flat).values()) / 4000 < 0.15 and len(shares(flat)) == 8
    _, mixed = conversations(2000, lora_adapters=names, lora_base_share=0.25)
    assert abs(shares(mixed)[None] / 2000 - 0.25) < 0.04  # None: the base model


def test_the_draw_is_reproducible_and_each_request_names_its_adapter() -> None:
    spec, first = conversations(50, lora_adapters=["a", "b", "c"], seed=7)
    _, again = conversations(50, lora_adapters=["a", "b", "c"], seed=7)
    assert [c.turns[0].adapter for c in first] == [c.turns[0].adapter for c in again]
    options = RequestOptions(model="base-model")
    for conversation in first[:10]:
        body = json.loads(build_item_bodies(conversation, options, "first")[0] or b"{}")
        assert body["model"] == conversation.turns[0].adapter
    _, plain = conversations(5)
    assert json.loads(build_item_bodies(plain[0], options, "first")[0] or b"{}")["model"] == "base-model"


@pytest.mark.hostile("bench --lora-adapters: empty names, embedded:0, duplicates, a skew without zipf: one line each")
def test_bad_lora_flags_are_one_line_each() -> None:
    def refusal(**flags: object) -> str:
        args = option_defaults({"base_url": "http://x", "model": "m", "concurrency": 1, "num_requests": 1, **flags})
        with pytest.raises(UserError) as caught:
            build_load_spec(args)
        return caught.value.message

    assert "give adapter names separated by commas" in refusal(lora_adapters="a,,b")
    assert "write embedded:N with N from 1 to 64" in refusal(lora_adapters="embedded:0")
    assert "name each adapter once" in refusal(lora_adapters="a,a")
    assert "use it with --lora-popularity zipf" in refusal(lora_adapters="a,b", lora_skew=2.0)
    assert "give --lora-adapters" in refusal(lora_popularity="zipf")
    assert "--lora-popularity 'pareto': use one of uniform, zipf" in refusal(lora_adapters="a", lora_popularity="pareto")
    assert "--lora-base-share" in refusal(lora_adapters="a", lora_base_share=1.5)
    ok = build_load_spec(
        option_defaults(
            {
                "base_url": "http://x",
                "model": "m",
                "concurrency": 1,
                "num_requests": 1,
                "lora_adapters": "a,b",
                "lora_popularity": "zipf",
                "lora_skew": 1.5,
            }
        )
    )
    assert (ok.lora_adapters, ok.lora_popularity, ok.lora_skew) == (["a", "b"], "zipf", 1.5)


def record(index: int, adapter: str | None, ttft_s: float, warmup: bool = False) -> RequestRecord:
    sent = float(index)
    return RequestRecord(
        request_id=f"r{index}",
        scheduled_at_s=sent,
        sent_at_s=sent,
        first_token_at_s=sent + ttft_s,
        finished_at_s=sent + ttft_s + 0.1,
        chunk_times_s=[sent + ttft_s, sent + ttft_s + 0.1],
        chunk_tokens=[1, 1],
        output_tokens=2,
        prompt_tokens=10,
        ok=True,
        adapter=adapter,
        warmup=warmup,
    )


def test_per_adapter_figures_carry_the_first_use_penalty() -> None:
    records = [
        record(0, "cold", 0.5),
        record(1, "cold", 0.1),
        record(2, "cold", 0.12),
        record(3, "cold", 0.08),
        record(4, "warmed", 0.9, warmup=True),
        record(5, "warmed", 0.1),
        record(6, "warmed", 0.1),
        record(7, None, 0.05),
    ]
    by_adapter = summarize(records, None).by_adapter
    assert by_adapter is not None and list(by_adapter) == ["cold", "warmed", "base"]  # most requested first
    cold = by_adapter["cold"]
    assert cold.requests == 4 and cold.share == pytest.approx(4 / 7)
    assert cold.first_use_ttft_ms == pytest.approx(500) and cold.warm_ttft_p50_ms == pytest.approx(100)
    assert cold.first_use_penalty_ms == pytest.approx(400) and cold.ttft_ms.p50 is not None
    warmed = by_adapter["warmed"]  # its first use was the warm-up: counted as its first use, left out of its figures
    assert warmed.requests == 2 and warmed.first_use_penalty_ms == pytest.approx(800)
    assert summarize([record(0, None, 0.1)], None).by_adapter is None  # no adapters: no block


def test_the_adapter_survives_the_records_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vlmserve.results.store import read_records_parquet, write_records_parquet

    written = write_records_parquet([record(0, "clinic", 0.1), record(1, None, 0.1)], tmp_path / "r.parquet")
    assert [row.adapter for row in read_records_parquet(written)] == ["clinic", None]
