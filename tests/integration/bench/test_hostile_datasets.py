"""Hostile dataset files for `bench`: each is one `error:` line naming the file and the bound, exit 2,
with bounded memory (the ShareGPT reader used to take 23.6 GB for a 200 KB file of brackets)."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from tests.helpers.bench_fixtures import bench_args
from tests.integration.bench.test_bad_inputs import dataset_error
from vlmserve.bench.workloads.trace import MAX_TRACE_IMAGES, MAX_TRACE_TOKENS
from vlmserve.bounded_read import CONFIG_FILE, DATASET_ITEM, TRACE_LINE


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.hostile(
    "bench --dataset sharegpt: a 200 KB file of 100,000 nested brackets is one line naming the depth limit, memory flat"
)
def test_sharegpt_of_nested_brackets_is_refused_in_bounded_memory(sim, cli, tmp_path: Path) -> None:
    path = tmp_path / "brackets.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    before = peak_rss_mb()
    line = dataset_error(sim, cli, path)
    assert line == (
        f"error: {path}: conversation 1 nests deeper than {DATASET_ITEM.max_depth} levels (the limit "
        "for a conversation); a ShareGPT conversation nests 3 levels: check --dataset-path"
    )
    assert peak_rss_mb() - before < 200, "reading the brackets raised the peak memory"


@pytest.mark.hostile("bench --dataset sharegpt: a conversation with over 100,000 values is one line naming the limit")
def test_sharegpt_conversation_with_too_many_values(sim, cli, tmp_path: Path) -> None:
    path = tmp_path / "wide.json"
    messages = [{"from": "human", "value": "hi"}] * 40_000
    path.write_text(json.dumps([{"id": "w", "conversations": messages}]))
    line = dataset_error(sim, cli, path)
    assert line.startswith(f"error: {path}: conversation 1 holds about 100,001 values, over the 100,000 limit for a conversation")


def trace_line(**fields: object) -> str:
    return json.dumps({"timestamp": 0, "input_length": 8, "output_length": 4, **fields})


@pytest.mark.hostile(
    "bench --dataset trace: a nested line, input_length 2e9, output_length 1e12 and images 1e8: one line naming the bound each"
)
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            '{"timestamp": 0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
            f"line 2: nests deeper than {TRACE_LINE.max_depth} levels (the limit for a trace line); fix the trace",
        ),
        (
            trace_line(input_length=2e9),
            f"line 2: input_length 2,000,000,000 is over the {MAX_TRACE_TOKENS:,} limit for a trace line; fix the trace",
        ),
        (
            trace_line(output_length=10**12),
            f"line 2: output_length 1,000,000,000,000 is over the {MAX_TRACE_TOKENS:,} limit for a trace line",
        ),
        (trace_line(images=1e8), f"line 2: images 100,000,000 is over the {MAX_TRACE_IMAGES:,} limit for a trace line"),
        ('{"timestamp": 1e999, "input_length": 8}', "line 2: has the number 1e999, which is not finite"),
    ],
    ids=["deep", "input-2e9", "output-1e12", "images-1e8", "timestamp-1e999"],
)
def test_trace_line_over_a_bound_is_one_line(sim, cli, tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(trace_line() + "\n" + line + "\n")
    error = dataset_error(sim, cli, path, dataset="trace")
    assert error.startswith(f"error: {path}: {expected}"), error


def test_trace_with_cr_line_ends_is_read_line_by_line(sim, cli, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("\r".join(trace_line(timestamp=index * 10) for index in range(3)) + "\r")
    done = cli(*bench_args(sim, "--dataset", "trace", "--dataset-path", path, "--concurrency", 1, "--num-requests", 3))
    assert done.code == 0, done.err
    assert "trace: 3 requests over 0.0 s from" in done.err  # three lines, not one malformed line


@pytest.mark.hostile("bench --extra-body @FILE nested 100,000 deep: one line naming the depth limit")
def test_extra_body_file_nested_deep(sim, cli, tmp_path: Path) -> None:
    path = tmp_path / "extra.json"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = cli(*bench_args(sim, "--concurrency", 1, "--num-requests", 1, "--extra-body", f"@{path}"))
    assert done.code == 2 and "Traceback" not in done.err
    assert done.error_line == (
        f"error: --extra-body: {path} nests deeper than {CONFIG_FILE.max_depth} levels (the limit for a config file)"
    )


@pytest.mark.hostile("bench --dataset trace: a line over 1 MiB is one line naming the byte limit, and is never held whole")
def test_trace_line_over_the_byte_limit(sim, cli, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(trace_line() + "\n" + trace_line(prompt="x" * (TRACE_LINE.max_bytes + 10)) + "\n")
    error = dataset_error(sim, cli, path, dataset="trace")
    assert error == f"error: {path}: line 2: is over the {TRACE_LINE.max_bytes:,}-byte limit for a trace line; fix the trace"
