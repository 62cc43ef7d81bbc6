"""A shortened sweep of examples/sweep-embedded-short.yaml against the real embedded vLLM engine.

The sweep runs against the session's engine (the `embedded_engine` fixture) as an endpoint
deployment rather than starting its own: an engine start is half a minute of CI on 2 cores. The
sweep's own start and tear-down of a managed deployment is covered with sim engines
(tests/e2e/sweep/test_sweep_sim.py), and the supervisor's start of real vLLM by the session
fixture and tests/e2e/test_supervisor.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO_ROOT
from vlmserve.report.html import write_html
from vlmserve.report.source import results_from_sweep_dir
from vlmserve.sweep.runner import run_sweep
from vlmserve.sweep.spec import parse_sweep_spec

REPO = REPO_ROOT


@pytest.mark.engine
@pytest.mark.slow
def test_embedded_short_sweep(embedded_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, artifacts_dir: Path) -> None:
    monkeypatch.setenv("VLMSERVE_HOME", str(tmp_path / "home"))
    example = REPO / "examples" / "sweep-embedded-short.yaml"
    data = yaml.safe_load(example.read_text())
    parse_sweep_spec(data, str(example), base_dir=example.parent)  # the example as published, engine flags included
    # shortened for CI: the session's engine, and two of the cells
    data["deployments"] = [
        {"name": data["deployments"][0]["name"], "endpoint": embedded_engine.base_url, "model": embedded_engine.model}
    ]
    data["cells"] = [data["cells"][0], data["cells"][1]]
    data["cells"][0]["vary"] = {"concurrency": [1, 4]}
    data["cells"][0]["base"]["num_requests"] = 8
    # prompts fitted with the model's own tokenizer, as a managed vLLM deployment's cells are
    data["cells"][0]["base"]["tokenizer"] = data["cells"][1]["tokenizer"] = embedded_engine.model_path
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
