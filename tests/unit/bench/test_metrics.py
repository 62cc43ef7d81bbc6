"""The metric definitions, checked on hand-made records with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from vlmserve.results import metrics
from vlmserve.results.blocks import ClientBlock
from vlmserve.results.records import RequestRecord
from vlmserve.spec import SLO


def record(
    index: int, ttft: float, gaps: list[float], tokens: list[int] | None = None, ok: bool = True, **extra
) -> RequestRecord:
    sent = 10.0 + index
    times = [sent + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    chunk_tokens = tokens or [1] * len(times)
    return RequestRecord(
        request_id=str(index),
        scheduled_at_s=sent,
        sent_at_s=sent,
        first_token_at_s=times[0],
        finished_at_s=times[-1],
        chunk_times_s=times,
        chunk_tokens=chunk_tokens,
        prompt_tokens=100,
        output_tokens=sum(chunk_tokens),
        ok=ok,
        **extra,
    )


def test_tpot_and_itl_per_token_with_batched_chunks():
    # 1 token, then a chunk of 3 tokens after 30 ms, then 1 token after 10 ms: 5 tokens
    one = record(0, ttft=0.1, gaps=[0.03, 0.01], tokens=[1, 3, 1])
    assert metrics.time_per_output_token_s(one) == pytest.approx(0.04 / 4)
    itl = metrics.inter_token_latencies_s(one)
    # the 30 ms gap carried 3 tokens: three values of 10 ms; then one of 10 ms
    assert itl.tolist() == pytest.approx([0.01, 0.01, 0.01, 0.01])
    assert metrics.time_to_first_token_s(one) == pytest.approx(0.1)


def test_one_token_answer_has_no_tpot():
    assert metrics.time_per_output_token_s(record(0, ttft=0.1, gaps=[])) is None


def test_summary_percentiles_and_denominators():
    records = [record(i, ttft=0.01 * (i + 1), gaps=[0.005] * 9) for i in range(100)]
    records.append(
        RequestRecord(request_id="bad", scheduled_at_s=50.0, sent_at_s=50.0, finished_at_s=50.1, error_kind="http_503")
    )
    records.append(record(200, ttft=5.0, gaps=[], warmup=True))
    summary = metrics.summarize(records, None).to_dict()
    assert summary["requests"] == {
        "total": 101,
        "completed": 100,
        "failed": 1,
        "failed_by_cause": {"http_503": 1},
        "success_rate": 100 / 101,
        "warmup_excluded": 1,
    }
    ttft = summary["ttft_ms"]
    values = np.arange(1, 101) * 10.0
    assert ttft["p50"] == pytest.approx(np.percentile(values, 50))
    assert ttft["p999"] == pytest.approx(np.percentile(values, 99.9))
    assert ttft["p50_p99_spread"] == pytest.approx(np.percentile(values, 99) - np.percentile(values, 50))
    assert ttft["min"] == pytest.approx(10.0) and ttft["max"] == pytest.approx(1000.0)
    assert summary["tpot_ms"]["mean"] == pytest.approx(5.0)
    window = summary["duration_s"]
    # first measured scheduled send (10 s) to the last measured byte (request 99: 109 + 1.0 + 9 × 0.005)
    assert window == pytest.approx(109 + 1.0 + 0.045 - 10.0)
    assert summary["throughput"]["requests_per_s"] == pytest.approx(100 / window)
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(1000 / window)
    assert summary["throughput"]["total_tokens_per_s"] == pytest.approx((1000 + 100 * 100) / window)
    assert summary["throughput"]["chunks_per_s"] == pytest.approx(1000 / window)


def test_goodput_per_request_and_aggregate_checks():
    records = [record(i, ttft=0.1 if i < 8 else 0.6, gaps=[0.01] * 4) for i in range(10)]
    records.append(RequestRecord(request_id="x", scheduled_at_s=30, sent_at_s=30, finished_at_s=30.2, error_kind="timeout"))
    good = metrics.summarize(records, SLO.parse("ttft_p90=500ms,tpot_p99=20ms")).to_dict()["goodput"]
    assert good["good_requests"] == 8
    assert good["fraction"] == pytest.approx(8 / 11)
    assert good["checks"]["ttft_p90"]["met"] is False  # p90 of [0.1]*8 + [0.6]*2 is above 0.5 s
    assert good["checks"]["tpot_p99"]["met"] is True
    assert metrics.summarize(records, None).to_dict()["goodput"] is None


def test_usage_tokenizer_disagreement_is_flagged():
    agree = record(0, ttft=0.1, gaps=[0.01] * 99, tokenizer_output_tokens=100)
    off = record(1, ttft=0.1, gaps=[0.01] * 99, tokenizer_output_tokens=90)
    tokens = metrics.summarize([agree, off], None).to_dict()["tokens"]
    assert tokens["tokenizer_checked"] == 2
    assert tokens["usage_tokenizer_disagreements"] == 1 and tokens["usage_tokenizer_disagree"] is True


def client(data: dict) -> ClientBlock:
    return ClientBlock.model_validate(data)


def test_client_judgement():
    fine = metrics.judge_client(
        client({"send_lag_ms": {"p99": 1.0}, "offered_rate": 100, "achieved_send_rate": 99}), open_loop=True
    )
    assert fine.limited is False
    lagging = metrics.judge_client(
        client({"send_lag_ms": {"p99": 80.0}, "offered_rate": 100, "achieved_send_rate": 70}), open_loop=True
    )
    assert lagging.limited is True and len(lagging.limited_reasons) == 2
    busy = metrics.judge_client(
        client({"send_lag_ms": {"p99": 1.0}, "cpu": {"worker_busy_fraction": {"0": 0.97}}}), open_loop=False
    )
    assert busy.limited and "worker 0 CPU 97% busy" in busy.limited_reasons[0]


def test_empty_run_has_every_key():
    summary = metrics.summarize([], SLO.parse("ttft_p95=1s")).to_dict()
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(metrics.DISTRIBUTION_KEYS) <= set(summary[key])
    assert summary["requests"]["completed"] == 0 and summary["goodput"]["fraction"] == 0.0
