"""An imported run's HTML report, opened in headless Chromium: every chart drawn, no console error.

The run is AIPerf 0.13's file from a live run (tests/fixtures/imports): figures only, no records,
so the load charts hold its one point and the page says it was imported and how its token
counts were made.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.browser import check_report_in_browser, find_chromium
from tests.helpers.paths import TESTS_ROOT

FIXTURES = TESTS_ROOT / "fixtures" / "imports"


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (scripts/ci-system-deps)")
@pytest.mark.parametrize("name", ["aiperf-0.13-sim.json", "guidellm-0.8-sim.json"])
def test_imported_runs_report_draws_every_chart_in_chromium(
    name: str, vlmserve_cmd: list[str], tmp_path: Path, artifacts_dir: Path
) -> None:
    env = {**os.environ, "VLMSERVE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    imported = subprocess.run(
        [*vlmserve_cmd, "runs", "import", str(FIXTURES / name)], capture_output=True, text=True, timeout=120, env=env
    )
    assert imported.returncode == 0, imported.stderr
    run_id = imported.stdout.split(" as run ")[1].split()[0]
    out = tmp_path / "report.html"
    done = subprocess.run(
        [*vlmserve_cmd, "report", run_id, "--html", str(out)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    page = out.read_text()
    assert "imported from " in page
    checks = check_report_in_browser(out, artifacts_dir / f"imported-{Path(name).stem}.png")
    assert checks["chart-throughput"] >= 1 and checks["chart-pareto"] >= 1, checks
