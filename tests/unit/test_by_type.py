"""Figures per request type, the TTFT breakdown's arithmetic, and per-type SLOs on the command line."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.results.breakdown import request_breakdown, ttft_breakdown
from vlmserve.results.metrics import summarize
from vlmserve.results.records import RequestRecord
from vlmserve.results.summary import FIGURES, figure
from vlmserve.spec import SLO


def record(
    index: int,
    request_type: str = "text",
    *,
    ttft: float = 0.5,
    upload: float | None = 0.05,
    engine: tuple[float, float, float] | None = (0.4, 0.1, 0.2),
    repeat: bool | None = None,
    ok: bool = True,
    size: int = 1000,
) -> RequestRecord:
    """One answered request sent at `index` s: TTFT `ttft`, two tokens, engine (ttft, queue, prefill)."""
    sent = float(index)
    engine_ttft, queue, prefill = engine if engine is not None else (None, None, None)
    return RequestRecord(
        f"r{index}",
        sent,
        sent,
        first_token_at_s=sent + ttft,
        finished_at_s=sent + ttft + 0.1,
        chunk_times_s=[sent + ttft, sent + ttft + 0.1],
        chunk_tokens=[1, 1],
        output_tokens=2,
        ok=ok,
        error_kind=None if ok else "http_500",
        request_type=request_type,
        image_repeat=repeat,
        image_count=1 if request_type == "image" else 0,
        upload_s=upload,
        request_bytes=size,
        engine_ttft_s=engine_ttft,
        engine_queue_s=queue,
        engine_prefill_s=prefill,
    )


# --- the breakdown's arithmetic ------------------------------------------------------------------


def test_one_request_s_parts_add_up_to_its_client_ttft() -> None:
    parts = request_breakdown(record(0, ttft=0.5, upload=0.05, engine=(0.4, 0.1, 0.2)))
    assert parts is not None and parts.complete
    assert parts.http_s == pytest.approx(0.05)  # 0.5 − 0.05 − 0.4
    assert parts.engine_frontend_s == pytest.approx(0.1)  # 0.4 − 0.1 − 0.2
    assert parts.frontend_s == pytest.approx(parts.http_s + parts.engine_frontend_s)
    assert parts.upload_s + parts.frontend_s + parts.queue_s + parts.prefill_s == pytest.approx(0.5)


def test_means_cover_only_requests_with_every_part_so_they_add_up() -> None:
    records = [
        record(0, ttft=0.5, engine=(0.4, 0.1, 0.2)),
        record(1, ttft=0.9, engine=(0.8, 0.3, 0.4)),
        record(2, ttft=5.0, engine=None),
        record(3, upload=None),
        record(4, ok=False),
    ]
    block = ttft_breakdown(records)
    assert block is not None and block["source"] == "engine spans"
    assert block["requests"] == 2 and block["without_engine_timings"] == 1
    assert block["client_ttft_ms"] == pytest.approx(700.0)
    assert block["queue_ms"] == pytest.approx(200.0) and block["prefill_ms"] == pytest.approx(300.0)
    total = block["upload_ms"] + block["frontend_ms"] + block["queue_ms"] + block["prefill_ms"]
    assert total == pytest.approx(block["client_ttft_ms"])
    assert block["http_ms"] + block["engine_frontend_ms"] == pytest.approx(block["frontend_ms"])
    assert block["accounted"] == pytest.approx((50.0 + 600.0) / 700.0)


def test_without_engine_timings_only_upload_and_the_rest_are_given() -> None:
    block = ttft_breakdown([record(0, ttft=0.5, upload=0.1, engine=None)])
    assert block is not None and block["source"] == "client only"
    assert block["upload_ms"] == pytest.approx(100.0) and block["after_upload_ms"] == pytest.approx(400.0)
    assert "queue_ms" not in block and "accounted" not in block
    assert ttft_breakdown([record(0, upload=None)]) is None


# --- per request type ----------------------------------------------------------------------------


def mixed_run() -> list[RequestRecord]:
    texts = [record(index, "text", ttft=0.2, size=500, engine=(0.15, 0.05, 0.05)) for index in range(4)]
    images = [record(10 + index, "image", ttft=0.8, size=50_000, repeat=index >= 2, engine=(0.7, 0.1, 0.5)) for index in range(4)]
    return texts + images + [record(20, "image", ok=False, repeat=False, size=50_000)]


def test_each_type_has_its_own_counts_latencies_size_and_breakdown() -> None:
    summary = summarize(mixed_run(), None)
    assert summary.by_type is not None and list(summary.by_type) == ["text", "image"]
    text, image = summary.by_type["text"], summary.by_type["image"]
    assert (text.requests, text.completed, image.requests, image.completed, image.failed) == (4, 4, 5, 4, 1)
    assert text.ttft_ms.p50 == pytest.approx(200.0) and image.ttft_ms.p50 == pytest.approx(800.0)
    assert image.request_bytes_mean == pytest.approx(50_000)
    assert image.breakdown is not None and image.breakdown.prefill_ms == pytest.approx(500.0)
    assert text.breakdown is not None and text.breakdown.prefill_ms == pytest.approx(50.0)
    assert text.by_repeat is None and text.goodput is None


def test_image_types_are_split_into_first_sight_and_repeats() -> None:
    image = summarize(mixed_run(), None).by_type["image"]  # type: ignore[index]
    assert image.by_repeat is not None and set(image.by_repeat) == {"first", "repeat"}
    assert (image.by_repeat["first"].requests, image.by_repeat["repeat"].requests) == (3, 2)
    assert image.by_repeat["first"].completed == 2


def test_by_type_figures_read_by_name() -> None:
    summary = summarize(mixed_run(), SLO.parse("image:ttft_p95=1s,text:ttft_p95=100ms"))
    assert summary.figure("by_type.image.ttft_ms.p50") == pytest.approx(800.0)
    assert summary.figure("by_type.image.repeat.requests") == 2.0
    assert summary.figure("by_type.text.breakdown.queue_ms") == pytest.approx(50.0)
    assert summary.figure("by_type.text.goodput.fraction") == 0.0
    assert summary.figure("by_type.video.ttft_ms.p95") is None  # no such requests in the run
    assert figure("by_type.image.breakdown.upload_ms").unit == "ms"
    assert {"by_type.multi-image.first.e2e_ms.p99", "by_type.audio.requests"} <= FIGURES.keys()
    with pytest.raises(KeyError, match=r"by_type\.<text\|image"):
        figure("by_type.pictures.ttft_ms.p95")


def test_each_type_is_judged_by_its_own_slo_on_top_of_the_run_s() -> None:
    summary = summarize(mixed_run(), SLO.parse("e2e_p95=5s,image:ttft_p95=1s,text:ttft_p95=100ms"))
    text, image = summary.by_type["text"], summary.by_type["image"]  # type: ignore[index]
    assert text.goodput is not None and image.goodput is not None
    assert set(text.goodput.checks) == {"e2e_p95", "ttft_p95"}
    assert text.goodput.all_met is False and text.goodput.good_requests == 0  # 200 ms > 100 ms
    assert image.goodput.all_met is True and image.goodput.good_requests == 4  # the failed one never counts
    assert image.goodput.fraction == pytest.approx(4 / 5)
    # the run-wide block keeps judging the plain objectives only
    assert summary.goodput is not None and set(summary.goodput.checks) == {"e2e_p95"}


def test_a_type_without_an_objective_has_no_goodput_when_only_another_type_has_one() -> None:
    summary = summarize(mixed_run(), SLO.parse("image:ttft_p95=1s"))
    assert summary.goodput is None
    assert summary.by_type["text"].goodput is None and summary.by_type["image"].goodput is not None  # type: ignore[index]


def test_summary_json_round_trips_with_the_per_type_block() -> None:
    from vlmserve.results.summary import RunSummary

    document = summarize(mixed_run(), SLO.parse("image:ttft_p95=1s")).to_dict()
    assert RunSummary.model_validate(document).to_dict() == document


# --- per-type SLOs on the command line -----------------------------------------------------------


def test_slo_parses_per_type_objectives_beside_plain_ones() -> None:
    slo = SLO.parse("image:ttft_p95=800ms, text:ttft_p95=300ms,e2e_p99=5s,multi-image:tpot_mean=40ms")
    assert slo.bounds_s == {"e2e_p99": 5.0}
    assert slo.by_type == {"image": {"ttft_p95": 0.8}, "text": {"ttft_p95": 0.3}, "multi-image": {"tpot_mean": 0.04}}
    assert slo.for_type("image").bounds_s == {"e2e_p99": 5.0, "ttft_p95": 0.8}
    assert slo.for_type("video").bounds_s == {"e2e_p99": 5.0}
    assert SLO.parse("ttft_p95=500ms").by_type == {}  # the plain form is unchanged


@pytest.mark.parametrize(
    "text, message",
    [
        ("vid:ttft_p95=1s", "--slo: unknown request type 'vid' in 'vid:ttft_p95=1s'; use text, image, multi-image, video, audio"),
        (":ttft_p95=1s", "--slo: unknown request type '' in ':ttft_p95=1s'; use text, image, multi-image, video, audio"),
        (
            "image:text:ttft_p95=1s",
            "--slo: unknown request type 'image:text' in 'image:text:ttft_p95=1s'; use text, image, multi-image, video, audio",
        ),
        (
            "image:ttft=1s",
            "--slo: unknown objective 'ttft'; use <ttft|tpot|itl|e2e>_<p50|p90|p95|p99|p999|mean>=DURATION, "
            "or a rate objective schema_valid / tool_call_valid>=FRACTION (e.g. schema_valid>=0.99 or >=99%)",
        ),
        ("image:ttft_p95", "--slo: 'image:ttft_p95' has no '='; write it like ttft_p95=500ms,image:ttft_p95=800ms"),
        ("image:ttft_p95=fast", "--slo: 'fast' is not a duration; write it like 500ms or 5s"),
        ("image:ttft_p95=-5ms", "--slo: '-5ms' is not a duration; write it like 500ms or 5s"),
        ("image:ttft_p95=10 minutes", "--slo: '10 minutes' is not a duration; write it like 500ms or 5s"),
        ("image:ttft_p95=0ms", "--slo: 'image:ttft_p95' must be positive"),
        ("image:ttft_p95=1s,image:ttft_p95=2s", "--slo: 'image:ttft_p95' is given twice; keep one bound"),
        ("ttft_p95=1s,ttft_p95=2s", "--slo: 'ttft_p95' is given twice; keep one bound"),
        (
            "Image:ttft_p95=1s",
            "--slo: unknown request type 'Image' in 'Image:ttft_p95=1s'; use text, image, multi-image, video, audio",
        ),
    ],
)
def test_hostile_slo_text_gets_one_line_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        SLO.parse(text)
    assert caught.value.message == message


def test_a_spec_file_s_unknown_type_is_refused_by_the_model() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="unknown request type 'pictures'"):
        SLO(by_type={"pictures": {"ttft_p95": 1.0}})
    with pytest.raises(ValidationError, match="unknown SLO 'ttft'"):
        SLO(by_type={"image": {"ttft": 1.0}})
