"""Simulated runs: the shared scheduler on the roofline, records and summary as bench makes them."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.hardware.setup import PlanSetup
from vlmserve.plan.simulate import simulate_run
from vlmserve.spec import LoadSpec

CALIBRATION = Calibration(Efficiency(bandwidth=0.7, compute=0.5, step_overhead_s=0.002, request_overhead_s=0.0))


def _setup(**options) -> PlanSetup:
    return PlanSetup.from_names(
        options.pop("model", "llama-3.1-8b"), options.pop("gpu", "h100"), calibration=CALIBRATION, **options
    )


def test_closed_loop_produces_simulated_bench_records() -> None:
    load = LoadSpec(input_len=512, output_len=32, concurrency=8, num_requests=40)
    output = simulate_run(_setup(), load)
    records = output.result.records
    assert len(records) == 40 and all(record.simulated and record.ok for record in records)
    assert all(record.output_tokens == 32 and len(record.chunk_times_s) == 32 for record in records)
    assert all(record.prompt_tokens == 512 for record in records)
    assert all(record.first_token_at_s <= record.finished_at_s for record in records)
    summary = output.result.summary.to_dict()
    assert summary["meta"]["simulated"] is True and output.result.simulated
    assert summary["requests"]["completed"] == 40
    assert summary["simulation"]["max_num_running"] == 8  # closed loop holds the concurrency
    assert summary["throughput"]["output_tokens_per_s"] > 0
    # decode steps at batch 8 are memory-bound: TPOT near the bandwidth roofline plus overhead
    assert 5.0 < summary["tpot_ms"]["mean"] < 15.0


def test_open_loop_overload_grows_ttft_not_throughput() -> None:
    setup = _setup(max_num_seqs=32)
    light = simulate_run(setup, LoadSpec(input_len=1024, output_len=128, rate=2.0, num_requests=60)).result.summary.to_dict()
    heavy = simulate_run(setup, LoadSpec(input_len=1024, output_len=128, rate=200.0, num_requests=300)).result.summary.to_dict()
    assert heavy["ttft_ms"]["mean"] > 10 * light["ttft_ms"]["mean"]
    assert heavy["throughput"]["requests_per_s"] < 200.0 * 0.5


def test_replicas_share_the_load() -> None:
    load = LoadSpec(input_len=256, output_len=64, concurrency=32, num_requests=200)
    one = simulate_run(_setup(), load).result
    two = simulate_run(_setup(replicas=2, routing="round-robin"), load).result
    workers = {record.worker for record in two.records}
    assert workers == {0, 1}
    assert two.summary.to_dict()["tpot_ms"]["mean"] < one.summary.to_dict()["tpot_ms"]["mean"]


def test_kv_pressure_causes_preemption_or_queueing() -> None:
    setup = _setup(gpu="l4", model="qwen3-4b", gpu_memory_utilization=0.6, max_model_len=4096)
    output = simulate_run(setup, LoadSpec(input_len=2000, output_len=500, concurrency=64, num_requests=96))
    simulation = output.result.summary.to_dict()["simulation"]
    assert simulation["max_kv_usage"] > 0.9
    assert simulation["max_num_running"] < 64 or simulation["preemptions"] > 0


def test_sharegpt_builtin_lengths_and_images() -> None:
    sharegpt = LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=16, num_requests=200)
    summary = simulate_run(_setup(), sharegpt).result.summary.to_dict()
    assert 150 < summary["tokens"]["actual_prompt_mean"] < 280
    assert 140 < summary["tokens"]["actual_output_mean"] < 250
    images = LoadSpec(dataset="images", input_len=64, output_len=16, concurrency=4, num_requests=12, images_per_request=2)
    vlm = simulate_run(_setup(model="qwen3-vl-4b"), images).result
    assert all(record.image_count == 2 and record.prompt_tokens > 64 for record in vlm.records)
    text_only = simulate_run(
        _setup(model="qwen3-vl-4b"), LoadSpec(input_len=64, output_len=16, concurrency=4, num_requests=12)
    ).result
    assert vlm.summary.to_dict()["ttft_ms"]["mean"] > text_only.summary.to_dict()["ttft_ms"]["mean"]
    with pytest.raises(UserError, match="has no vision tower"):
        simulate_run(_setup(), images)


def test_staggered_closed_loop_has_no_synchronized_first_wave() -> None:
    load = LoadSpec(input_len=1024, output_len=64, concurrency=32, num_requests=256)
    together = simulate_run(_setup(), load).result.summary.to_dict()
    staggered = simulate_run(_setup(), load, staggered=True).result.summary.to_dict()
    assert staggered["ttft_ms"]["p99"] < together["ttft_ms"]["p99"]


def test_simulated_run_can_be_stored_and_reloaded(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path))
    from vlmserve.results.store import load_run, save_run

    result = simulate_run(_setup(), LoadSpec(input_len=128, output_len=8, concurrency=2, num_requests=6)).result
    run_id = save_run(result)
    loaded = load_run(run_id)
    assert loaded.simulated and len(loaded.records) == 6 and all(record.simulated for record in loaded.records)
    # `vlmserve report` reads it like any measured run
    from vlmserve.cli.app import main

    with pytest.raises(SystemExit) as done:
        main(["report", run_id, "--md", str(tmp_path / "report.md")])
        raise SystemExit(0)
    assert done.value.code in (0, None)
    assert "plan meta-llama/Llama-3.1-8B-Instruct" in (tmp_path / "report.md").read_text()


def test_time_outside_the_engine_is_in_every_ttft_also_while_the_engine_is_busy() -> None:
    """request_overhead_s delays each request's entry to the scheduler, not only the ones that find it idle."""
    slow_http = Calibration(Efficiency(bandwidth=0.7, compute=0.5, step_overhead_s=0.002, request_overhead_s=0.05))
    setup = PlanSetup.from_names("llama-3.1-8b", "h100", calibration=slow_http)
    load = LoadSpec(dataset="sharegpt", dataset_path="builtin", concurrency=4, num_requests=40)  # lengths vary: never idle
    records = simulate_run(setup, load).result.records
    ttfts = [record.ttft_s for record in records]
    assert len(ttfts) == 40 and min(t for t in ttfts if t is not None) >= 0.05
