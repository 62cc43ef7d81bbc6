"""Sweep spec loading: matrices expand, and every malformed spec is one line naming the field."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT
from vlmserve.errors import UserError
from vlmserve.sweep.spec import load_sweep_spec

REPO = REPO_ROOT
GOOD = """
name: tiny
deployments:
  - name: sim1
    spec: {engine: sim, model: m, replicas: 1, gateway: false}
cells:
  - base: {input_len: 16, output_len: 4, num_requests: 4}
    vary: {concurrency: [1, 2]}
    name: "c{concurrency}"
  - name: one
    concurrency: 1
    num_requests: 2
slo: {ttft_p95: 500ms}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_matrix_expands_and_slo_parses(tmp_path: Path) -> None:
    spec = load_sweep_spec(write(tmp_path, GOOD))
    assert [cell.name for cell in spec.cells] == ["c1", "c2", "one"]
    assert spec.cells[1].load.concurrency == 2 and spec.cells[1].load.input_len == 16
    assert spec.slo.bounds_s == {"ttft_p95": 0.5}
    assert spec.cell_keys()[0] == ("sim1", "c1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("replicas: 1", "replicas: 0"), "field 'deployments.0.spec.replicas'"),
        (GOOD.replace("input_len: 16", "input_lenn: 16"), "field 'cells.0.load.input_lenn': unknown field"),
        (
            GOOD.replace("    concurrency: 1\n    num_requests: 2\n", "    num_requests: 2\n"),
            "field 'cells.2.load': give concurrency",
        ),
        (
            GOOD.replace("spec: {engine: sim, model: m, replicas: 1, gateway: false}", "endpoint: not-a-url"),
            "field 'deployments.0.endpoint'",
        ),
        (GOOD.replace("ttft_p95: 500ms", "ttft_p95: soon"), "field 'slo.ttft_p95'"),
        (GOOD.replace("ttft_p95: 500ms", "ttft_p42: 1s"), "field 'slo.bounds_s'"),
        (GOOD.replace("name: one", "name: c1"), "name 'c1' is used twice"),
        (GOOD.replace('name: "c{concurrency}"', 'name: "c{users}"'), "field 'cells.0.name'"),
        ("name: x\ncells: []\n", "field 'deployments'"),
        (GOOD.replace("name: tiny", "name: tiny sweep"), "field 'name': use letters, digits"),
        ("- just a list\n", "a sweep spec is a YAML mapping"),
    ],
)
def test_malformed_spec_names_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(UserError) as caught:
        load_sweep_spec(write(tmp_path, text))
    assert expected in caught.value.message
    assert "\n" not in caught.value.message


def test_missing_dataset_file_is_named(tmp_path: Path) -> None:
    text = (
        GOOD + "  - name: chat\n    dataset: sharegpt\n    dataset_path: nowhere.json\n    concurrency: 1\n    num_requests: 2\n"
    )
    text = text.replace("slo: {ttft_p95: 500ms}\n", "") + "slo: {ttft_p95: 500ms}\n"
    with pytest.raises(UserError) as caught:
        load_sweep_spec(write(tmp_path, text))
    assert "nowhere.json does not exist" in caught.value.message


def test_examples_are_valid() -> None:
    for path in sorted((REPO / "examples").glob("sweep-*.yaml")):
        spec = load_sweep_spec(path)
        assert spec.cells and spec.deployments, path


def test_cli_malformed_spec_is_one_line(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    path = write(tmp_path, GOOD.replace("replicas: 1", "replicas: -3"))
    done = subprocess.run(
        [*vlmserve_cmd, "sweep", str(path), "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ") and "deployments.0.spec.replicas" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_each_cell_draws_its_own_prompts_unless_it_sets_a_seed() -> None:
    # one engine serves every cell in turn: a shared seed would hand a later cell the prompts an
    # earlier one left in the prefix cache
    from vlmserve.sweep.runner import _cell_seed
    from vlmserve.sweep.spec import parse_sweep_spec

    spec = parse_sweep_spec(
        {
            "name": "s",
            "deployments": [{"name": "d", "endpoint": "http://127.0.0.1:9", "model": "m"}],
            "cells": [
                {"name": "a", "concurrency": 1, "num_requests": 1},
                {"name": "b", "concurrency": 4, "num_requests": 1},
                {"name": "c", "concurrency": 4, "num_requests": 1, "seed": 7},
            ],
        },
        "test",
    )
    seeds = [_cell_seed(spec, cell) for cell in spec.cells]
    assert seeds[0] != seeds[1] and 0 not in seeds[:2] and seeds[2] == 7
