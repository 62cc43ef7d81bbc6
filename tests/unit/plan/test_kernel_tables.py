"""Measured kernel tables: where they are found, which vLLM version, how they interpolate."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from vlmserve.hardware.kernels import tables
from vlmserve.hardware.kernels.interp import interp_curve, interp_log
from vlmserve.hardware.kernels.locate import choose_version, covers, locate_table


def test_interpolation_is_exact_at_table_points_and_between_its_neighbours() -> None:
    grid, values = [1.0, 4.0, 16.0, 64.0], [0.01, 0.012, 0.05, 0.3]
    for x, y in zip(grid, values):
        assert interp_log(grid, values, x) == (y, None)
    for low in range(len(grid) - 1):
        previous = values[low]
        for step in range(1, 20):
            x = grid[low] * (grid[low + 1] / grid[low]) ** (step / 20)
            y, clamped = interp_log(grid, values, x)
            assert clamped is None
            assert values[low] <= y <= values[low + 1]
            assert y >= previous  # monotone between neighbours
            previous = y
    # log-log linear: halfway in log x is the geometric mean
    assert interp_log(grid, values, 2.0)[0] == pytest.approx(math.sqrt(0.01 * 0.012))


def test_beyond_the_table_the_edge_is_scaled_by_the_roofline_and_flagged() -> None:
    grid, values = [1.0, 10.0], [1.0, 2.0]
    value, extrapolated = interp_curve(grid, values, 40.0, lambda a, b: b / a)
    assert extrapolated and value == pytest.approx(2.0 * 4.0)
    assert interp_curve(grid, values, 5.0, lambda a, b: b / a)[1] is False


def _gemm_rows(gpu: str, dtype: str) -> dict[tuple[int, int, int], float]:
    ref = locate_table(gpu, "gemm", "gemm_perf")
    assert ref is not None
    rows = pq.read_table(ref.path, columns=["m", "n", "k", "latency", "gemm_dtype"]).to_pylist()
    best: dict[tuple[int, int, int], float] = {}
    for row in rows:
        if row["gemm_dtype"] == dtype:
            key = (row["m"], row["n"], row["k"])
            best[key] = min(best.get(key, math.inf), row["latency"])
    return best


def test_gemm_lookup_returns_the_measured_row_at_table_points() -> None:
    rows = _gemm_rows("h100", "bfloat16")
    table = tables.gemm_table(locate_table("h100", "gemm", "gemm_perf"), "bfloat16")
    assert table is not None
    keys = [(1, 4096, 4096), (64, 6144, 4096), (2048, 4096, 16384), (17, 28672 // 2 + 2048, 4096), (32768, 65536, 8192)]
    checked = 0
    for key in keys:
        if key not in rows:
            continue
        value, extrapolated = table.latency_ms(*key, roof=lambda m, n, k: 2.0 * m * n * k)
        assert not extrapolated
        assert value == pytest.approx(rows[key], rel=1e-12)
        checked += 1
    assert checked >= 3


def test_gemm_lookup_between_rows_stays_between_them() -> None:
    rows = _gemm_rows("h100", "bfloat16")
    table = tables.gemm_table(locate_table("h100", "gemm", "gemm_perf"), "bfloat16")
    assert table is not None
    ms = sorted({m for m, n, k in rows if (n, k) == (4096, 4096)})
    for low, high in zip(ms, ms[1:]):
        if high - low < 2:
            continue
        middle = (low * high) ** 0.5
        value, _ = table.latency_ms(middle, 4096, 4096, roof=lambda m, n, k: 2.0 * m * n * k)
        a, b = rows[(low, 4096, 4096)], rows[(high, 4096, 4096)]
        assert min(a, b) <= value <= max(a, b)


def test_version_choice_is_the_closest_to_the_deployments_newest_by_default() -> None:
    versions = ["0.14.0", "0.19.0", "0.24.0"]
    assert choose_version(versions, None) == "0.24.0"
    assert choose_version(versions, "0.15.2") == "0.14.0"
    assert choose_version(versions, "0.22.0") == "0.24.0"
    assert choose_version(versions, "0.30.0") == "0.24.0"
    assert choose_version([], None) is None
    assert locate_table("h100", "comm", "custom_allreduce_perf", "0.15").vllm_version == "0.14.0"  # type: ignore[union-attr]
    assert locate_table("h100", "comm", "custom_allreduce_perf").vllm_version == "0.24.0"  # type: ignore[union-attr]


def test_gpu_keys_map_to_the_tables_that_cover_them() -> None:
    for gpu in ("h100", "h200", "a100", "l40s", "b200"):
        assert covers(gpu), gpu
    assert locate_table("a100", "gemm", "gemm_perf").vllm_version == "0.14.0"  # type: ignore[union-attr]
    assert not covers("l4")  # AIConfigurator has no vLLM data for the L4
    assert not covers("mi300x")
    assert locate_table("h100", "no-such-op", "x") is None


def test_a_version_folder_that_reuses_another_resolves_to_its_files(tmp_path) -> None:
    from vlmserve.hardware.kernels.locate import _resolve_reuse

    measured, reusing, broken = tmp_path / "0.24.0", tmp_path / "0.22.0", tmp_path / "0.21.0"
    for folder in (measured, reusing, broken):
        folder.mkdir()
    (measured / "gemm_perf.parquet").write_bytes(b"")
    (reusing / "reuse.yaml").write_text("reuse:\n- table: gemm_perf\n  from_version: 0.24.0\n")
    (broken / "reuse.yaml").write_text("reuse:\n- table: gemm_perf\n  from_version: 0.99.0\n")
    assert _resolve_reuse(measured) == measured
    assert _resolve_reuse(reusing) == measured
    assert _resolve_reuse(broken) is None
    # a reused folder is labelled with both versions
    ref = locate_table("b200", "attention", "context_attention_perf", "0.22.0")
    assert ref is not None and ref.vllm_version == "0.22.0"


def test_vision_shapes_come_from_the_vision_config() -> None:
    from vlmserve.hardware.kernels.vision_shape import raw_config_or_none, vision_shape

    shape = vision_shape(raw_config_or_none("qwen3-vl-4b") or {})
    assert shape is not None
    assert (shape.hidden, shape.intermediate, shape.layers, shape.heads, shape.head_dim) == (1024, 4096, 24, 16, 64)
    assert shape.patches_per_token == 4 and shape.out_hidden == 2560
    assert vision_shape(raw_config_or_none("llama-3.1-8b") or {}) is None
    assert vision_shape({"vision_config": {"hidden_size": 64}}) is None  # no depth or heads: not guessed
    assert raw_config_or_none("no-such-model") is None
