"""The image workloads: a stated repeat rate is what the workload sends, and the mixes are honoured."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from vlmserve.bench.tokens import WordCounter
from vlmserve.bench.workloads import WorkloadContext, build_conversations
from vlmserve.bench.workloads.image_reuse import ImagePicker
from vlmserve.cli.bench import build_load_spec, option_defaults
from vlmserve.errors import UserError
from vlmserve.spec import LoadSpec


def context(**load) -> WorkloadContext:
    spec = LoadSpec(concurrency=1, num_requests=1, dataset="images", image_size=(8, 8), input_len=8, **load)
    return WorkloadContext(load=spec, counter=WordCounter(), rng=random.Random(3))


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.5, 0.9])
def test_picker_repeats_at_the_stated_rate(rate: float) -> None:
    counter = iter(range(10**6))
    picker = ImagePicker(random.Random(1), lambda: f"img-{next(counter)}", repeat_rate=rate)
    flags = [picker.pick(1)[1] for _ in range(2000)]
    assert abs(sum(flags) / len(flags) - rate) < 0.04
    assert len(picker.sent) == len(flags) - sum(flags)  # every non-repeat is a new image


def test_repeats_favour_popular_images() -> None:
    counter = iter(range(10**6))
    picker = ImagePicker(random.Random(2), lambda: f"img-{next(counter)}", repeat_rate=0.8, skew=1.2)
    picks = Counter(url for _ in range(3000) for url in picker.pick(1)[0])
    top = [count for _, count in picks.most_common(5)]
    assert top[0] > 10 * sorted(picks.values())[len(picks) // 2]  # the head is far above the median image


def test_multi_image_repeats_are_distinct_and_flagged() -> None:
    counter = iter(range(10**6))
    picker = ImagePicker(random.Random(4), lambda: f"img-{next(counter)}", repeat_rate=0.5)
    for _ in range(300):
        seen_before = set(picker.sent)
        urls, repeat = picker.pick(3)
        assert len(set(urls)) == 3
        assert repeat == all(url in seen_before for url in urls)


def test_images_workload_sets_types_repeats_budgets_and_sizes() -> None:
    ctx = context(
        image_repeat_rate=0.5,
        images_per_request_mix={1: 0.5, 2: 0.5},
        vision_budget_mix={70: 0.5, 280: 0.5},
        image_size_mix=[(8, 8, 1.0), (16, 8, 1.0)],
    )
    conversations = build_conversations(ctx, 200)
    turns = [c.turns[0] for c in conversations]
    assert {t.request_type for t in turns} == {"image", "multi-image"}
    assert all(t.request_type == ("image" if t.image_count == 1 else "multi-image") for t in turns)
    assert {t.mm_processor_kwargs["max_soft_tokens"] for t in turns if t.mm_processor_kwargs} == {70, 280}
    repeats = sum(bool(t.image_repeat) for t in turns) / len(turns)
    assert 0.35 < repeats < 0.6
    assert any("repeat rate 0.50 stated" in notice for notice in ctx.notices)


def test_text_requests_stay_text() -> None:
    ctx = WorkloadContext(load=LoadSpec(concurrency=1, num_requests=1), counter=WordCounter(), rng=random.Random(0))
    turn = build_conversations(ctx, 1)[0].turns[0]
    assert turn.request_type == "text" and turn.image_repeat is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"image_sizes": "256x256:x"}, "--image-sizes '256x256:x': write VALUE:WEIGHT pairs"),
        ({"image_sizes": "banana:1"}, "--image-sizes 'banana:1': write VALUE:WEIGHT pairs"),
        ({"image_sizes": "256x256:0"}, "--image-sizes: give at least one positive weight"),
        ({"images_per_request_mix": "-1:1"}, "--images-per-request-mix '-1:1'"),
        ({"vision_budgets": "0:1"}, "--vision-budgets: budgets are soft tokens per image"),
        ({"image_repeat_rate": 1.5}, "--image-repeat-rate"),
        ({"image_popularity_skew": -1.0}, "--image-popularity-skew"),
    ],
)
def test_hostile_image_flags(flags: dict[str, object], message: str) -> None:
    with pytest.raises(UserError) as error:
        build_load_spec(
            option_defaults({"base_url": "http://x", "concurrency": 1, "num_requests": 1, "dataset": "images", **flags})
        )
    assert message in str(error.value) and "\n" not in str(error.value)
