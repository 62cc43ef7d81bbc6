"""Hardware side: catalog, memory fit, KV capacity, TP communication, calibration files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT  # noqa: E402
from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration, Efficiency, default_calibration
from vlmserve.hardware.gpus import GIB, WEIGHT_ONLY_COMPUTE_EFFICIENCY, allreduce_time_s, catalog, get_gpu
from vlmserve.hardware.memory import plan_memory
from vlmserve.hardware.models import load_model
from vlmserve.hardware.setup import DEFAULT_GPU_MEMORY_UTILIZATION, PlanSetup, vllm_default_limits

REFERENCE_CSV = REPO_ROOT.parent / "shared/reference/hardware.csv"  # the shared data beside the checkout
PACKAGED_CSV = REPO_ROOT / "src/vlmserve/hardware/data/hardware.csv"


def test_catalog_matches_reference_and_names_are_case_insensitive() -> None:
    if REFERENCE_CSV.exists():
        # every reference row is kept verbatim in the reference's columns; Blackwell rows and the
        # fp4/visible-memory columns are additions
        reference = [row.split(",") for row in REFERENCE_CSV.read_text().splitlines()]
        packaged = [row.split(",") for row in PACKAGED_CSV.read_text().splitlines()]
        width = len(reference[0])
        assert [row[:width] for row in packaged[: len(reference)]] == reference
    assert {"h100", "h200", "a100", "l40s", "l4", "gb10", "mi300x", "b200", "b300", "gb200"} <= set(catalog())
    assert get_gpu("H100").memory_gb == 80
    assert get_gpu("h200").memory_bandwidth_tb_s == 4.8
    assert get_gpu("MI300X").bf16_tflops == 1307
    assert get_gpu("L40S").interconnect_gb_s == 64
    assert get_gpu("A100").fp8_tflops is None
    # no FP8 units: FP8 weights run weight-only, below BF16 peak
    assert get_gpu("a100").peak_flops("fp8") == 312e12 * WEIGHT_ONLY_COMPUTE_EFFICIENCY < get_gpu("a100").peak_flops("bf16")
    assert get_gpu("h100").peak_flops("fp8") == 1979e12
    assert get_gpu("gb10").bf16_tflops == 125.0  # assumed (not on the datasheet), see ASSUMED_FIGURES


def test_unknown_gpu_lists_known_ones() -> None:
    with pytest.raises(
        UserError, match=r"unknown GPU 'v100'; known GPUs: a100, b200, b300, gb10, gb200, h100, h200, l4, l40s, mi300x"
    ):
        get_gpu("v100")


def test_model_that_does_not_fit_says_how_much_is_missing() -> None:
    model = load_model("llama-3.1-70b")
    h100 = get_gpu("h100")
    with pytest.raises(UserError) as caught:
        plan_memory(model, h100, 1, weight_dtype="bf16", gpu_memory_utilization=0.9)
    assert "does not fit on 1× H100 SXM" in caught.value.message
    assert "GiB missing in all" in caught.value.message
    # four GPUs hold it: KV = visible × 0.9 − weights/4 − the profiling peak, per GPU, in GiB
    memory = plan_memory(model, h100, 4, weight_dtype="bf16", gpu_memory_utilization=0.9)
    budget = 79.18 * GIB * 0.9
    assert memory.budget_bytes_per_gpu == pytest.approx(budget)
    assert memory.kv_bytes_per_gpu == pytest.approx(budget - model.weight_bytes("bf16") / 4 - memory.reserved_bytes_per_gpu)
    assert memory.kv_bytes_total == pytest.approx(4 * memory.kv_bytes_per_gpu)
    # FP8 weights halve the bytes: it fits on one H200 with room for KV
    assert plan_memory(model, get_gpu("h200"), 1, weight_dtype="fp8", gpu_memory_utilization=0.9).kv_gb_total > 40


def test_tp_must_split_heads_and_kv_must_hold_one_request() -> None:
    with pytest.raises(UserError, match="32 attention heads, which 3 GPUs cannot split evenly"):
        PlanSetup.from_names("llama-3.1-8b", "h100", tp=3).memory()
    setup = PlanSetup.from_names("llama-3.1-8b", "l4", gpu_memory_utilization=0.85)
    with pytest.raises(UserError, match=r"holds \d+ tokens, less than one 100000-token request \(\d+\.\d+ GB missing\)"):
        setup.scheduler_config(1000, 100_000)


def test_kv_capacity_from_memory_left_after_weights() -> None:
    setup = PlanSetup.from_names("llama-3.1-8b", "h100")
    memory = setup.memory()
    assert memory.kv_bytes_per_gpu == pytest.approx(
        79.18 * GIB * DEFAULT_GPU_MEMORY_UTILIZATION
        - load_model("llama-3.1-8b").weight_bytes("bf16")
        - memory.reserved_bytes_per_gpu
    )
    # whole 16-token blocks of 128 KiB tokens
    assert setup.kv_capacity_tokens(2000) == int(memory.kv_bytes_per_gpu / (131072 * 16)) * 16
    # sliding layers keep only the window: a long context costs fewer bytes per token
    oss = PlanSetup.from_names("gpt-oss-120b", "h200")
    assert oss.kv_capacity_tokens(8000) > oss.kv_capacity_tokens(1000)


def test_vllm_default_engine_limits_follow_gpu_memory() -> None:
    assert vllm_default_limits(get_gpu("h100")) == (1024, 8192)
    assert vllm_default_limits(get_gpu("a100")) == (256, 2048)
    assert vllm_default_limits(get_gpu("l40s")) == (256, 2048)


def test_allreduce_ring_cost() -> None:
    gpu = get_gpu("h100")
    assert allreduce_time_s(1e6, 1, gpu, 1.0, 1e-5) == 0.0
    expected = 1e-5 + 2 * (4 - 1) / 4 * 1e6 / 450e9  # NVLink 4's 900 GB/s counts both directions
    assert allreduce_time_s(1e6, 4, gpu, 1.0, 1e-5) == pytest.approx(expected)
    assert allreduce_time_s(1e6, 4, get_gpu("l40s"), 1.0, 1e-5) > 10 * allreduce_time_s(1e6, 4, gpu, 1.0, 0.0)


def test_calibration_round_trip_and_bad_files(tmp_path: Path) -> None:
    calibration = Calibration(Efficiency(bandwidth=0.6), {"l4": {"compute": 0.3}}, "test")
    path = tmp_path / "cal.json"
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded.for_gpu("l4").compute == 0.3 and loaded.for_gpu("l4").bandwidth == 0.6
    assert loaded.for_gpu("h100").compute == Efficiency().compute
    assert "fitted" in default_calibration().source or "defaults" in default_calibration().source
    path.write_text(json.dumps({"default": {"bandwith": 0.5}}))
    with pytest.raises(UserError, match="unknown coefficient 'bandwith'"):
        Calibration.load(path)
    path.write_text(json.dumps({"default": {"bandwidth": -1}}))
    with pytest.raises(UserError, match="coefficient 'bandwidth' must be a number ≥ 0"):
        Calibration.load(path)
    path.write_text("[")
    with pytest.raises(UserError, match="not valid JSON"):
        Calibration.load(path)
    with pytest.raises(UserError, match="no such calibration file"):
        Calibration.load(tmp_path / "missing.json")
