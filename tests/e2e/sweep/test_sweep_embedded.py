"""A shortened sweep against the real embedded vLLM engine, started fresh by the sweep itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vlmserve.report.html import write_html
from vlmserve.report.source import results_from_sweep_dir
from vlmserve.sweep.runner import run_sweep
from vlmserve.sweep.spec import parse_sweep_spec
from tests.helpers.paths import REPO_ROOT

REPO = REPO_ROOT


@pytest.mark.engine
@pytest.mark.slow
def test_embedded_short_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, artifacts_dir: Path) -> None:
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))
    example = REPO / "examples" / "sweep-embedded-short.yaml"
    data = yaml.safe_load(example.read_text())
    # shortened for CI: one replica (one engine start on 2 cores) and two of the cells
    data["deployments"][0]["spec"]["replicas"] = 1
    data["cells"] = [data["cells"][0], data["cells"][1]]
    data["cells"][0]["vary"] = {"concurrency": [1, 4]}
    data["cells"][0]["base"]["num_requests"] = 8
    spec = parse_sweep_spec(data, str(example), base_dir=example.parent)
    out = tmp_path / "sweep"
    run_sweep(spec, out, progress=False)
    results = results_from_sweep_dir(out)
    assert results.outcome_line() == "3 of 3 cells succeeded"
    info = results.deployments[0]
    assert info.status == "done" and info.server_version, info
    images = next(cell for cell in results.cells if cell.cell == "images-c2")
    assert images.metric("tokens.images_total") == 8
    write_html(results, artifacts_dir / "sweep-embedded-short.html")
