"""The tune's HTML page renders in headless Chromium: every chart drawn, marked simulated, nothing fetched.

The outcome is built from store records as a tune leaves them (a baseline, a winner, one within
its interval, one failed with its log, the rest only predicted), so the page shows every kind of row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.browser import check_report_in_browser, find_chromium
from vlmserve.bench.slo_search import SearchSpace
from vlmserve.report.plots_common import SIMULATED_TITLE_MARK
from vlmserve.spec import SLO, DeploymentSpec, LoadSpec
from vlmserve.tune.html import CHART_IDS, render_html, write_html
from vlmserve.tune.predict import Prediction
from vlmserve.tune.recommend import recommend
from vlmserve.tune.run import TuneOutcome, TuneSettings
from vlmserve.tune.space import TuneSpace
from vlmserve.tune.store import CandidateRecord, Interval

BASE = DeploymentSpec.model_validate(
    {
        "name": "page",
        "engine": "sim",
        "model": "m",
        "gateway": False,
        "engine_args": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
        "sim": {"profile": "a10g-8b"},
    }
)


def outcome(tmp_path: Path) -> TuneOutcome:
    space = TuneSpace.parse(BASE, ["max-num-seqs=16,64", "max-num-batched-tokens=1024,4096"])
    settings = TuneSettings(LoadSpec(rate=1, duration_s=2), SLO.parse("ttft_p95=400ms"), SearchSpace("rate", 1, 32, 0.3, 6))
    base, win, near, broken = space.candidates()

    def record(candidate, order, low, high, ttft, status="measured"):  # type: ignore[no-untyped-def]
        return CandidateRecord(
            id=candidate.id,
            label=candidate.label,
            params=dict(candidate.params),
            baseline=candidate.baseline,
            order=order,
            status=status,
            goodput_rps=low if status == "measured" else None,
            interval=Interval(low=low, high=high) if status == "measured" else None,
            predicted_rps=low * 1.3,
            ttft_p95_ms=ttft,
            reason="replica 0 engine exited with code 2 during start-up" if status == "failed" else None,
            log=str(tmp_path / "replica-0.log") if status == "failed" else None,
        )

    records = [
        record(base, 0, 1.9, 2.4, 300.0),
        record(win, 1, 3.7, 4.6, 190.0),
        record(near, 2, 3.3, 4.1, 250.0),
        record(broken, 3, 0.0, None, None, status="failed"),
    ]
    predictions = {candidate.id: Prediction(index + 1.0) for index, candidate in enumerate(space.candidates())}
    return TuneOutcome(space, settings, tmp_path, predictions, None, records, recommend(records), 4)


def test_page_shows_every_candidate_and_why(tmp_path: Path) -> None:
    page = render_html(outcome(tmp_path))
    for chart in CHART_IDS:
        assert f'id="{chart}"' in page
    assert page.count("<script") == 1 + len(CHART_IDS), "plotly.js once, then one script per chart"
    assert "beats the baseline" in page and "recommended" in page and "failed: replica 0 engine exited" in page
    assert "within the best candidate&#x27;s interval" in page
    assert "measured on the sim engine: simulated" in page and "predicted by the planner (simulated)" in page


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (scripts/ci-system-deps)")
def test_tune_page_renders_in_chromium(tmp_path: Path, artifacts_dir: Path) -> None:
    page = write_html(outcome(tmp_path), tmp_path / "report.html")
    checks = check_report_in_browser(
        page, artifacts_dir / "tune.png", chart_ids=CHART_IDS, title_mark=SIMULATED_TITLE_MARK.strip()
    )
    assert checks["chart-tune-goodput"] == 1, "the predicted markers: one scatter trace (bars are not scatter)"
    assert checks["chart-tune-pareto"] == 2, "the candidates and the Pareto front"


def test_without_a_planner_the_page_says_so_and_drops_the_prediction_chart(tmp_path: Path) -> None:
    full = outcome(tmp_path)
    records = [record.model_copy(update={"predicted_rps": None}) for record in full.records]
    bare = TuneOutcome(
        full.space,
        full.settings,
        tmp_path,
        {},
        "no planner model of the vLLM engine on this machine",
        records,
        recommend(records),
        4,
    )
    page = render_html(bare)
    assert 'id="chart-tune-predicted"' not in page and 'id="chart-tune-goodput"' in page
    assert "Planner: no planner model of the vLLM engine on this machine; candidates were measured in Optuna" in page
