"""End-to-end bench runs against the real sim engine: every workload, both load modes, goodput."""

from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest

from tests.helpers.bench_fixtures import SIM_MODEL, bench_args, write_sharegpt
from tests.helpers.sim import start_sim_engine
from vlmserve.bench.runner import Target, run_load
from vlmserve.results import store
from vlmserve.results.metrics import ClientLimits
from vlmserve.spec import SLO, LoadSpec


def run(handle, slo: str | None = None, limits: ClientLimits = ClientLimits(), **load):
    spec = LoadSpec(**load)
    return asyncio.run(
        run_load(spec, Target(handle.base_url, SIM_MODEL), slo=SLO.parse(slo), progress=False, client_limits=limits)
    )


def test_random_closed_loop_exact_lengths(sim):
    result = run(sim, concurrency=4, num_requests=24, input_len=40, output_len=8, warmup=4)
    summary = result.summary.to_dict()
    assert summary["requests"]["completed"] == 24
    assert summary["requests"]["warmup_excluded"] == 4
    assert len(result.records) == 28
    tokens = summary["tokens"]
    # the sim's /tokenize counts the chat template: the prompt is exactly the requested length
    assert summary["meta"]["prompt_lengths_exact"] is True
    assert tokens["actual_prompt_mean"] == 40 and tokens["prompt_length_mismatches"] == 0
    assert tokens["actual_output_mean"] == 8 and tokens["output_length_mismatches"] == 0
    # constant-latency engine: TTFT ≈ 20 ms, TPOT ≈ 2 ms (loose bounds: shared machine)
    assert 15 < summary["ttft_ms"]["p50"] < 200
    assert 1 < summary["tpot_ms"]["p50"] < 50
    assert summary["itl_ms"]["count"] == 24 * 7  # one ITL per token after the first
    for key in ("p50", "p90", "p95", "p99", "p999", "mean", "std", "min", "max"):
        assert summary["e2e_ms"][key] is not None
    assert summary["meta"]["per_chunk_usage"] is True
    assert summary["client"]["limited"] is False
    assert summary["server"]["available"] is True


def test_open_loop_poisson_and_constant(sim):
    result = run(
        sim, rate=40, arrival="poisson", num_requests=30, input_len=16, output_len=4, api="completions", per_chunk_usage=False
    )
    summary = result.summary.to_dict()
    assert summary["requests"]["completed"] == 30
    # without per-chunk counts each chunk is one token, and usage's total still matches
    assert summary["meta"]["per_chunk_usage"] is False and summary["itl_ms"]["count"] == 30 * 3
    assert summary["client"]["offered_rate"] is not None
    assert summary["client"]["send_lag_ms"]["p50"] < 25
    constant = run(sim, rate=50, arrival="constant", duration_s=0.6, input_len=16, output_len=4)
    sent = constant.summary.to_dict()["requests"]["total"]
    assert 25 <= sent <= 31  # 0.6 s × 50/s = 30 sends (offsets 0 .. 0.58 s)
    scheduled = sorted(record.scheduled_at_s for record in constant.records)
    gaps = [b - a for a, b in zip(scheduled, scheduled[1:])]
    assert all(abs(gap - 0.02) < 1e-6 for gap in gaps)


def test_gamma_arrivals_in_worker_processes(sim):
    result = run(sim, rate=60, arrival="gamma", burstiness=0.5, num_requests=30, input_len=16, output_len=4, workers=2)
    assert result.summary.to_dict()["requests"]["completed"] == 30
    assert {record.worker for record in result.records} == {0, 1}
    assert result.summary.to_dict()["client"]["workers"] == 2 and result.summary.to_dict()["client"]["in_process"] is False
    assert result.summary.to_dict()["client"]["cpu"]["processes"] == 2


def test_goodput_counts_failures_in_denominator(tmp_path):
    with start_sim_engine(model=SIM_MODEL, ttft_ms=20, itl_ms=2, error_rate=0.3, seed=3) as flaky:
        result = run(flaky, slo="ttft_p95=2s,e2e_p99=5s", concurrency=4, num_requests=40, input_len=16, output_len=4)
    summary = result.summary.to_dict()
    failed = summary["requests"]["failed"]
    assert failed > 0 and summary["requests"]["completed"] + failed == 40
    assert set(summary["requests"]["failed_by_cause"]) == {"http_500"}
    goodput = summary["goodput"]
    assert goodput["good_requests"] == summary["requests"]["completed"]
    assert goodput["fraction"] == pytest.approx(summary["requests"]["completed"] / 40)
    assert goodput["checks"]["ttft_p95"]["met"] is True
    strict = run_summary_with_slo(result, "ttft_p50=1ms")
    assert strict["good_requests"] == 0 and strict["fraction"] == 0 and not strict["all_met"]


def run_summary_with_slo(result, slo_text):
    from vlmserve.results.metrics import summarize

    return summarize(result.records, SLO.parse(slo_text)).to_dict()["goodput"]


def sharegpt_conversations():
    return [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "hello there"},
                {"from": "gpt", "value": "hi how can I help"},
                {"from": "human", "value": "tell me a story"},
                {"from": "gpt", "value": "once upon a time"},
            ],
        },
        {"id": "b", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "one question only"}]},
        {"id": "empty", "conversations": []},
        {
            "id": "c",
            "conversations": [
                {"from": "human", "value": "first"},
                {"from": "gpt", "value": "answer one"},
                {"from": "human", "value": "second"},
                {"from": "gpt", "value": "answer two"},
                {"from": "human", "value": "third, no reply in the file"},
            ],
        },
    ]


@pytest.mark.parametrize("mode", ["dataset", "live"])
def test_sharegpt_multi_turn_with_truncated_tail(sim, tmp_path, mode):
    path = write_sharegpt(
        tmp_path / "sg.json", sharegpt_conversations(), truncate_tail='{"id": "cut", "conversations": [{"from": "hum'
    )
    result = run(sim, dataset="sharegpt", dataset_path=str(path), multi_turn=mode, concurrency=2, num_requests=8)
    summary = result.summary.to_dict()
    notices = " ".join(summary["meta"]["notices"])
    assert "loaded 3 conversations" in notices and "1 empty conversation" in notices and "1 truncated at end of file" in notices
    assert summary["requests"]["completed"] == 8
    assert set(summary["per_turn"]) == {"0", "1", "2"}
    assert summary["per_turn"]["2"]["requests"] == 1
    # later turns carry the history: their prompts are longer than first turns'
    assert summary["per_turn"]["1"]["mean_prompt_tokens"] > summary["per_turn"]["0"]["mean_prompt_tokens"]
    assert {record.conversation_id for record in result.records} >= {"a", "b", "c"}


def test_sharegpt_first_turn_only(sim, tmp_path):
    path = write_sharegpt(tmp_path / "sg.json", sharegpt_conversations())
    result = run(sim, dataset="sharegpt", dataset_path=str(path), concurrency=2, num_requests=3)
    assert all(record.turn_index == 0 for record in result.records)
    assert "per_turn" not in result.summary


def test_images_synthetic_and_folder(sim, tmp_path):
    result = run(
        sim,
        dataset="images",
        images_per_request=2,
        image_size=(32, 24),
        image_format="jpeg",
        concurrency=2,
        num_requests=6,
        input_len=20,
        output_len=4,
    )
    summary = result.summary.to_dict()
    assert summary["requests"]["completed"] == 6
    assert summary["tokens"]["images_total"] == 12
    # image tokens come back in usage on top of the text prompt
    assert summary["tokens"]["actual_prompt_mean"] > 20
    folder = tmp_path / "imgs"
    folder.mkdir()
    from PIL import Image

    Image.new("RGB", (16, 16), "red").save(folder / "red.png")
    (folder / "broken.png").write_bytes(b"not an image")
    from_folder = run(
        sim,
        dataset="images",
        image_dir=str(folder),
        concurrency=1,
        num_requests=2,
        input_len=10,
        output_len=2,
        mm_processor_kwargs={"max_image_tokens": 64},
    )
    assert from_folder.summary.to_dict()["requests"]["completed"] == 2
    assert any("skipped 1 unreadable (broken.png)" in notice for notice in from_folder.summary.to_dict()["meta"]["notices"])


def test_mixed_workload_reports_per_workload(sim):
    result = run(
        sim,
        dataset="mixed",
        mix={"random": 0.5, "images": 0.5},
        concurrency=2,
        num_requests=12,
        input_len=12,
        output_len=3,
        seed=5,
    )
    per_workload = result.summary.to_dict()["per_workload"]
    assert set(per_workload) == {"random", "images"}
    assert sum(block["requests"] for block in per_workload.values()) == 12


def test_trace_replay_follows_arrival_times(sim, tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [
        json.dumps({"timestamp": 1000, "input_length": 20, "output_length": 3}),
        json.dumps({"timestamp": 1100, "input_length": 30, "output_length": 2}),
        "not json",
        json.dumps({"timestamp": 1300, "input_length": 10, "output_length": 2, "images": 1}),
        json.dumps({"input_length": 10}),
    ]
    trace.write_text("\n".join(lines) + "\n")
    result = run(sim, dataset="trace", dataset_path=str(trace), num_requests=10)
    assert result.summary.to_dict()["requests"]["completed"] == 3
    scheduled = sorted(record.scheduled_at_s for record in result.records)
    assert [round(t - scheduled[0], 3) for t in scheduled] == [0.0, 0.1, 0.3]
    notice = " ".join(result.summary.to_dict()["meta"]["notices"])
    assert "skipped" in notice and "1 not JSON" in notice


def test_server_metrics_sampling_can_be_limited_to_before_and_after(sim):
    spec = LoadSpec(concurrency=2, num_requests=6, input_len=16, output_len=4)
    result = asyncio.run(run_load(spec, Target(sim.base_url, SIM_MODEL), progress=False, server_metrics_interval_s=0))
    server = result.summary.to_dict()["server"]
    # counters still come from the scrapes around the run; no sampling in between
    assert server["available"] is True and server["gauge_samples"] == 2
    assert server["counters"]["requests_finished"] >= 6


def test_extra_body_reasoning_and_tool_calls_are_counted():
    """The client counts reasoning text and tool calls from the stream (a chat answer with both)."""
    from vlmserve.bench.client import _finish, _StreamState
    from vlmserve.results.records import RequestRecord

    state = _StreamState(keep_text=True)
    events = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"reasoning_content": "think"}}]},
        {"choices": [{"delta": {"reasoning_content": " more"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "t0", "function": {"name": "f"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"delta": {"content": "done"}}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5}},
    ]
    for moment, event in enumerate(events):
        state.event(json.dumps(event).encode(), float(moment))
    state.event(b"[DONE]", 9.0)
    record = RequestRecord(request_id="r", scheduled_at_s=0.0, sent_at_s=0.0, finished_at_s=9.0)
    _finish(record, state)
    assert record.ok and record.first_token_at_s == 1.0  # the role-only chunk is not a token
    assert record.reasoning_tokens == 2 and record.tool_calls == 1
    assert record.output_tokens == 5 and sum(record.chunk_tokens) == 5


def test_cli_outputs_history_and_client_limited_mark(sim, cli, tmp_path):
    json_out, records_out = tmp_path / "s.json", tmp_path / "r.parquet"
    # One worker asked for a million req/s cannot keep the schedule (each send costs tens of
    # microseconds of Python, 200 sends several ms): the run must say the client limited it, everywhere.
    done = cli(
        *bench_args(
            sim,
            "--rate",
            1000000,
            "--arrival",
            "constant",
            "--num-requests",
            200,
            "--input-len",
            8,
            "--output-len",
            2,
            "--workers",
            1,
            "--max-send-lag-ms",
            1,
            "--label",
            "overload",
            "--json-out",
            json_out,
            "--records-out",
            records_out,
        )
    )
    assert done.code == 0, done.err
    summary = json.loads(json_out.read_text())
    assert summary["client"]["limited"] is True and summary["meta"]["client_limited"] is True
    assert summary["client"]["limited_reasons"]
    assert "CLIENT-LIMITED" in done.out
    metadata = pq.read_schema(records_out).metadata
    assert metadata[b"vlmserve.client_limited"] == b"true"
    assert pq.read_table(records_out).num_rows == 200
    listed = cli("runs", "list", "--json")
    rows = json.loads(listed.out)
    assert rows[0]["label"] == "overload" and rows[0]["client_limited"] is True
    shown = cli("runs", "show", rows[0]["run_id"], "--json")
    assert json.loads(shown.out)["requests"]["total"] == 200
    assert store.load_run(rows[0]["run_id"][:12]).records[0].request_id


def test_runs_list_and_show_from_history(sim, cli):
    first = cli(*bench_args(sim, "--concurrency", 2, "--num-requests", 4, "--input-len", 8, "--output-len", 2, "--label", "one"))
    second = cli(*bench_args(sim, "--concurrency", 2, "--num-requests", 6, "--input-len", 8, "--output-len", 2, "--label", "two"))
    assert first.code == 0 and second.code == 0
    runs = store.list_runs()
    assert [row["label"] for row in runs] == ["two", "one"]
    table = cli("runs", "list")
    assert runs[0]["run_id"] in table.out and "two" in table.out
    shown = cli("runs", "show", runs[1]["run_id"])
    assert shown.code == 0 and "4 ok, 0 failed" in shown.out and "4 request records stored" in shown.out
    loaded = store.load_run(runs[1]["run_id"])
    assert loaded.summary.to_dict()["meta"]["label"] == "one" and len(loaded.records) == 4
    missing = cli("runs", "show", "nope")
    assert missing.code == 2 and "no run 'nope'" in missing.error_line


def test_closed_loop_stops_at_duration(sim):
    result = run(sim, concurrency=3, duration_s=0.8, input_len=8, output_len=4)
    summary = result.summary.to_dict()
    assert summary["requests"]["completed"] >= 6 and summary["requests"]["failed"] == 0
    first_send = min(record.sent_at_s for record in result.records)
    # nothing is sent after the deadline; requests in flight at the deadline are awaited and counted
    assert max(record.sent_at_s for record in result.records) - first_send < 0.8 + 0.05


def test_first_token_with_held_back_text_counts_for_ttft():
    """With per-chunk counts, a token whose text the server holds back still marks the first token."""
    from vlmserve.bench.client import _finish, _StreamState
    from vlmserve.results.records import RequestRecord

    state = _StreamState(keep_text=False)
    events = [
        {"choices": [{"text": ""}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        {"choices": [{"text": "é"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 3}},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}},
    ]
    for moment, event in enumerate(events):
        state.event(json.dumps(event).encode(), 1.0 + moment)
    state.event(b"[DONE]", 5.0)
    record = RequestRecord(request_id="r", scheduled_at_s=0.0, sent_at_s=0.0, finished_at_s=5.0)
    _finish(record, state)
    assert record.ok and record.ttft_s == 1.0 and record.chunk_tokens == [1, 1, 1]
