"""The console's per-type table and TTFT breakdown."""

from __future__ import annotations

from rich.console import Console

from tests.unit.test_by_type import mixed_run, record
from vlmserve.bench.console_types import print_types
from vlmserve.results.metrics import summarize
from vlmserve.spec import SLO


def printed(summary) -> str:  # type: ignore[no-untyped-def]
    console = Console(record=True, width=220)
    print_types(console, summary)
    return console.export_text()


def test_types_splits_breakdown_and_slo_verdicts_are_printed() -> None:
    summary = summarize(mixed_run(), SLO.parse("image:ttft_p95=1s,text:ttft_p95=100ms"))
    summary.server = {
        "engine_breakdown": {"ttft_ms": 100.0, "queue_ms": 10.0, "prefill_ms": 60.0, "frontend_ms": 30.0, "requests": 8},
        "mm_cache_hit_rate": 0.25,
    }
    text = printed(summary)
    assert "engine (its /metrics histograms): TTFT 100.0 ms = frontend 30.0 + queue 10.0 + prefill 60.0" in text
    assert "multimodal cache hit rate 25.0%" in text
    assert "image · repeat" in text and "image · first" in text
    assert "missed ttft_p95 (0% good)" in text and "met (80% good)" in text
    image_row = next(line for line in text.splitlines() if line.strip().startswith("image ") and "req" in line)
    # TTFT 800 = upload 50 + frontend 150 (http 100, engine 100) + queue 100 + prefill 500; accounted (50 + 700) / 800
    for cell in ("800.0", "50.00", "150.0", "100.0", "500.0", "94%", "4 req"):
        assert cell in image_row, (cell, image_row)


def test_a_plain_text_run_without_engine_timings_prints_nothing_extra() -> None:
    summary = summarize([record(index, engine=None) for index in range(3)], None)
    assert printed(summary) == ""


def test_client_only_breakdown_says_how_to_get_the_engine_parts() -> None:
    summary = summarize([record(index, "image", engine=None, repeat=False) for index in range(3)], None)
    assert "--engine-traces HOST:PORT" in printed(summary)
