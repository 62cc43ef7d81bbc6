"""Measured kernel tables, loaded once per file and shape family, as curves ready to interpolate.

Each table becomes, per exact key (dtype, heads, ...), one latency curve per outer coordinate
(GEMM: per (n, k) over m; attention: per batch over sequence length). Where a cell was measured
with several kernels (vLLM picks among FP8 block kernels, FlashAttention 3 and 4), the fastest
is kept: vLLM's kernel selection is assumed to pick well. Latencies stay in milliseconds, as
measured; callers convert.

Files are read with pyarrow only (a core dependency), filtered to the rows one lookup family
needs, and cached for the life of the process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Hashable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlmserve.hardware.kernels.interp import blend_log, bracket, interp_curve
from vlmserve.hardware.kernels.locate import TableRef

Curve = tuple[list[float], list[float]]
"""(sorted grid, latency in ms at each grid point)."""
Roof = Callable[..., float]
"""Roofline seconds of the op at a shape: the ratio between two shapes scales extrapolation."""


def _curves(keys: list[Hashable], xs: list[float], latencies: list[float]) -> dict[Hashable, Curve]:
    """Group rows into curves over x, keeping the fastest latency per (key, x)."""
    best: dict[Hashable, dict[float, float]] = {}
    for key, x, latency in zip(keys, xs, latencies):
        if latency is None or latency <= 0:
            continue
        cell = best.setdefault(key, {})
        if x not in cell or latency < cell[x]:
            cell[x] = latency
    return {key: (sorted(cell), [cell[x] for x in sorted(cell)]) for key, cell in best.items()}


@dataclass(frozen=True)
class Categorical:
    """A string column as integer codes into its few distinct values (compared and grouped as ints)."""

    codes: np.ndarray
    values: list[str]

    def equals(self, value: object) -> np.ndarray:
        code = self.values.index(value) if isinstance(value, str) and value in self.values else -1
        return self.codes == code


@lru_cache(maxsize=None)
def _columns(ref: TableRef, columns: tuple[str, ...]) -> dict[str, np.ndarray | Categorical]:
    """Whole columns, read once per file: numbers as numpy arrays, strings as `Categorical`.

    Avoided on purpose, each costing most of a second at start-up: `read_table(filters=...)`
    (imports pyarrow.dataset), pyarrow's `to_numpy` (imports pandas), `dictionary_encode`
    (imports pyarrow.compute). Strings are read dictionary-encoded by the Parquet reader itself.
    """
    schema = pq.ParquetFile(ref.path).schema_arrow
    present = [name for name in columns if name in schema.names]
    strings = [
        name
        for name in present
        if pa.types.is_string(schema.field(name).type) or pa.types.is_large_string(schema.field(name).type)
    ]
    table = pq.ParquetFile(ref.path, read_dictionary=strings).read(columns=present)
    arrays = {name: _to_numpy(table.column(name)) for name in present}
    for name in columns:
        if name not in arrays:
            if name not in ABSENT_MEANS:
                raise LookupError(f"{ref.path}: no column '{name}'")
            arrays[name] = np.full(table.num_rows, ABSENT_MEANS[name], dtype=np.int64)
    return arrays


ABSENT_MEANS: dict[str, int] = {"window_size": 0}
"""Columns older tables lack, and what their absence means (vLLM 0.14's attention tables: no window)."""


def _to_numpy(column: pa.ChunkedArray) -> np.ndarray | Categorical:
    if pa.types.is_dictionary(column.type):
        values: list[str] = []
        codes = []
        for chunk in column.chunks:
            local = chunk.dictionary.to_pylist()
            for value in local:
                if value not in values:
                    values.append(value)
            remap = np.array([values.index(value) for value in local], dtype=np.int64)
            codes.append(remap[_buffer_view(chunk.indices)] if len(local) else np.zeros(len(chunk), dtype=np.int64))
        return Categorical(np.concatenate(codes) if codes else np.array([], dtype=np.int64), values)
    if (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)) and column.null_count == 0:
        return np.concatenate([_buffer_view(chunk) for chunk in column.chunks]) if column.chunks else np.array([])
    return np.array(column.to_pylist())


def _buffer_view(chunk: pa.Array) -> np.ndarray:
    dtype = np.dtype(chunk.type.to_pandas_dtype())
    return np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)


def _equals(column: np.ndarray | Categorical, value: object) -> np.ndarray:
    return column.equals(value) if isinstance(column, Categorical) else column == value


def _codes_or_numbers(column: np.ndarray | Categorical) -> np.ndarray:
    return column.codes if isinstance(column, Categorical) else column


def _numbers(column: np.ndarray | Categorical) -> np.ndarray:
    assert not isinstance(column, Categorical), "a numeric column was read as strings"
    return column


def _unique_rows(arrays: list[np.ndarray | Categorical]) -> set[tuple[Any, ...]]:
    """Distinct combinations of several equal-length columns, as Python tuples."""
    codes: list[np.ndarray] = []
    values: list[list[Any]] = []
    for array in arrays:
        if isinstance(array, Categorical):
            codes.append(array.codes)
            values.append(list(array.values))
        else:
            unique_values, inverse = np.unique(array, return_inverse=True)
            codes.append(inverse.reshape(-1))
            values.append(unique_values.tolist())
    if not codes or not len(codes[0]):
        return set()
    # One int64 per row (mixed radix over the columns' code ranges): a 1-D unique is fast, a row-wise one is not.
    combined = np.zeros(len(codes[0]), dtype=np.int64)
    for code, column_values in zip(codes, values):
        combined = combined * max(len(column_values), 1) + code
    rows = []
    for packed in np.unique(combined).tolist():
        row = []
        for distinct in reversed(values):
            packed, code = divmod(packed, max(len(distinct), 1))
            row.append(distinct[code])
        rows.append(tuple(reversed(row)))
    return set(rows)


def _grouped_curves(key_arrays: list[np.ndarray], x: np.ndarray, latency: np.ndarray) -> dict[Hashable, Curve]:
    """Curves over x per distinct key (numpy-grouped; the fastest latency per (key, x))."""
    good = latency > 0
    key_arrays, x, latency = [array[good] for array in key_arrays], x[good], latency[good]
    order = np.lexsort([latency, x] + key_arrays[::-1])
    keys = [array[order] for array in key_arrays]
    x, latency = x[order], latency[order]
    if not len(x):
        return {}
    new_key = np.zeros(len(x), dtype=bool)
    new_key[0] = True
    for array in keys:
        new_key[1:] |= array[1:] != array[:-1]
    first_of_cell = new_key.copy()
    first_of_cell[1:] |= x[1:] != x[:-1]
    keep = np.flatnonzero(first_of_cell)
    starts = np.flatnonzero(new_key[keep])
    bounds = list(starts[1:]) + [len(keep)]
    xs, lats = x[keep].tolist(), latency[keep].tolist()
    key_values = [array[keep].tolist() for array in keys]
    curves: dict[Hashable, Curve] = {}
    for start, end in zip(starts.tolist(), bounds):
        key = tuple(values[start] for values in key_values)
        curves[key[0] if len(key) == 1 else key] = ([float(v) for v in xs[start:end]], lats[start:end])
    return curves


def _rows(ref: TableRef, columns: tuple[str, ...], where: dict[str, Any]) -> dict[str, list[Any]]:
    """The rows whose `where` columns equal the given values, as lists per column."""
    data = _columns(ref, columns)
    mask = np.ones(len(_codes_or_numbers(data[columns[0]])), dtype=bool)
    for name, value in where.items():
        mask &= _equals(data[name], value)
    return {name: _numbers(data[name])[mask].tolist() for name in columns if name not in where}


def _along_m(roof: Roof, n: float, k: float) -> Callable[[float, float], float]:
    """Roofline growth from m = a to m = b at fixed (n, k)."""
    return lambda a, b: _roof_ratio(roof, (a, n, k), (b, n, k))


def _along_length(roof: Roof, batch: float) -> Callable[[float, float], float]:
    """Roofline growth from length a to b at a fixed batch."""
    return lambda a, b: _roof_ratio(roof, (batch, a), (batch, b))


def _roof_ratio(roof: Roof, start: tuple[float, ...], end: tuple[float, ...]) -> float:
    base = roof(*start)
    return roof(*end) / base if base > 0 else 1.0


@dataclass
class GemmTable:
    """Latency of one GEMM dtype by (m, n, k): curves over m for each measured (n, k)."""

    ref: TableRef
    dtype: str
    curves: dict[Any, Curve]
    """(n, k) → curve over m."""
    n_grid: list[float] = field(default_factory=list)
    k_grid: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.n_grid = sorted({float(key[0]) for key in self.curves})
        self.k_grid = sorted({float(key[1]) for key in self.curves})

    def latency_ms(self, m: float, n: float, k: float, roof: Roof) -> tuple[float, bool]:
        """Interpolated latency (log-linear in m, n and k) and whether it left the measured grid.

        Nearest-shape rule: a missing (n, k) corner is skipped and the others re-weighted;
        beyond the grid in n or k the edge is scaled by the roofline's growth to (n, k).
        """
        bn, bk = bracket(self.n_grid, n), bracket(self.k_grid, k)
        n_edge, k_edge = self.n_grid[bn.low], self.k_grid[bk.low]
        pairs: list[tuple[float, float]] = []
        extrapolated = bn.clamped_to is not None or bk.clamped_to is not None
        for ni, wn in ((bn.low, 1.0 - bn.weight), (bn.high, bn.weight)):
            for ki, wk in ((bk.low, 1.0 - bk.weight), (bk.high, bk.weight)):
                if wn * wk <= 0 and (ni, ki) != (bn.low, bk.low):
                    continue
                cn, ck = self.n_grid[ni], self.k_grid[ki]
                curve = self.curves.get((cn, ck))
                if curve is None:
                    continue
                value, beyond = interp_curve(curve[0], curve[1], m, _along_m(roof, cn, ck))
                extrapolated |= beyond
                pairs.append((wn * wk, value))
        if not pairs:
            raise LookupError(f"no measured GEMM near n={n:g}, k={k:g}")
        value = blend_log(pairs)
        if bn.clamped_to is not None or bk.clamped_to is not None:
            value *= _roof_ratio(roof, (m, n_edge if bn.clamped_to else n, k_edge if bk.clamped_to else k), (m, n, k))
        return value, extrapolated


@lru_cache(maxsize=None)
def gemm_table(ref: TableRef, dtype: str) -> GemmTable | None:
    """The GEMM rows of one dtype ('bfloat16', 'fp8', 'fp8_block', 'nvfp4'), or None if not measured."""
    data = _columns(ref, ("m", "n", "k", "latency", "gemm_dtype"))
    mask = _equals(data["gemm_dtype"], dtype)
    if not mask.any():
        return None
    n, k, m = (_numbers(data[name])[mask].astype(float) for name in ("n", "k", "m"))
    curves = _grouped_curves([n, k], m, _numbers(data["latency"])[mask])
    return GemmTable(ref, dtype, curves)


@dataclass
class GridTable:
    """Latency by (batch, length) for one exact shape key: curves over length, one per batch."""

    ref: TableRef
    by_batch: dict[float, Curve]
    batches: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.batches = sorted(self.by_batch)

    def latency_ms(self, batch: float, length: float, roof: Roof) -> tuple[float, bool]:
        """Log-linear in batch and length; beyond the measured range, scaled by roof(batch, length)."""
        b = bracket(self.batches, batch)
        pairs: list[tuple[float, float]] = []
        extrapolated = b.clamped_to is not None
        for index, weight in ((b.low, 1.0 - b.weight), (b.high, b.weight)):
            if weight <= 0 and index != b.low:
                continue
            at = self.batches[index]
            grid, values = self.by_batch[at]
            value, beyond = interp_curve(grid, values, length, _along_length(roof, at))
            extrapolated |= beyond
            pairs.append((weight, value))
        value = blend_log(pairs)
        if b.clamped_to is not None:
            value *= _roof_ratio(roof, (b.clamped_to, length), (batch, length))
        return value, extrapolated


class ShapeGrids:
    """The GridTables of one file, one per exact shape key, each built on first use.

    Building every shape's curves up front costs about a second per attention table; a
    deployment needs a handful of shapes.
    """

    def __init__(self, ref: TableRef, key_columns: tuple[str, ...], length_column: str, length_offset: float = 0.0) -> None:
        self.ref = ref
        self._key_columns = key_columns
        self._columns = key_columns + ("batch_size", length_column, "latency")
        self._length_column = length_column
        self._length_offset = length_offset
        data = _columns(ref, self._columns)
        self._keys = _unique_rows([data[name] for name in key_columns])
        self._built: dict[Hashable, GridTable] = {}

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(sorted(self._keys, key=str))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __getitem__(self, key: tuple[Any, ...]) -> GridTable:
        built = self._built.get(key)
        if built is None:
            if key not in self._keys:
                raise KeyError(key)
            rows = _rows(self.ref, self._columns, dict(zip(self._key_columns, key)))
            lengths = [float(x) + self._length_offset for x in rows[self._length_column]]
            curves = _curves([float(b) for b in rows["batch_size"]], lengths, rows["latency"])
            built = GridTable(self.ref, {float(b): curve for b, curve in curves.items()})  # type: ignore[arg-type]
            self._built[key] = built
        return built


AttentionKey = tuple[int, int, int, str, int]
"""(q heads, kv heads, head dim, KV-cache dtype, window; 0 = none) per GPU."""

_ATTENTION_KEY = ("num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "window_size")


@lru_cache(maxsize=None)
def context_attention_tables(ref: TableRef) -> ShapeGrids:
    """Prefill attention of `batch` prompts of `isl` tokens each (causal, no prior context)."""
    return ShapeGrids(ref, _ATTENTION_KEY, "isl")


@lru_cache(maxsize=None)
def generation_attention_tables(ref: TableRef) -> ShapeGrids:
    """Decode attention of `batch` sequences, one query each, over `step` + 1 cached tokens."""
    return ShapeGrids(ref, _ATTENTION_KEY, "step", 1.0)


@lru_cache(maxsize=None)
def encoder_attention_tables(ref: TableRef) -> ShapeGrids:
    """ViT attention (bidirectional, no KV cache) of `batch` images of `isl` patches, keyed (heads, head dim)."""
    return ShapeGrids(ref, ("num_heads", "head_dim"), "isl")


MoeKey = tuple[str, int, int, int, int, int, int]
"""(dtype, hidden, expert width, top-k, experts, MoE TP, MoE EP) — balanced routing only."""


@lru_cache(maxsize=None)
def moe_curves(ref: TableRef) -> dict[Hashable, Curve]:
    """One MoE layer's latency (all experts, routing included) by tokens, per exact shape."""
    names = ("moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")
    data = _columns(ref, names + ("num_tokens", "latency", "distribution"))
    mask = _equals(data["distribution"], "balanced")
    keys = [_codes_or_numbers(data[name])[mask] for name in names]
    curves = _grouped_curves(keys, _numbers(data["num_tokens"])[mask].astype(float), _numbers(data["latency"])[mask])
    dtypes = data["moe_dtype"]
    assert isinstance(dtypes, Categorical)
    return {(dtypes.values[key[0]],) + tuple(key[1:]): curve for key, curve in curves.items()}  # type: ignore[index]


@lru_cache(maxsize=None)
def allreduce_curves(ref: TableRef) -> dict[Hashable, Curve]:
    """vLLM's custom all-reduce (CUDA-graph captured) by message size in elements, per GPU count."""
    rows = _rows(ref, ("num_gpus", "message_size", "latency", "backend"), {"backend": "vllm_graph"})
    return _curves(list(rows["num_gpus"]), [float(x) for x in rows["message_size"]], rows["latency"])


@lru_cache(maxsize=None)
def nccl_allreduce_curves(ref: TableRef) -> dict[Hashable, Curve]:
    """NCCL all-reduce of 16-bit elements by message size in elements, per GPU count."""
    rows = _rows(
        ref, ("num_gpus", "message_size", "latency", "op_name", "nccl_dtype"), {"op_name": "all_reduce", "nccl_dtype": "half"}
    )
    return _curves(list(rows["num_gpus"]), [float(x) for x in rows["message_size"]], rows["latency"])
