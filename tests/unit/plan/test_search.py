"""Search: the cheapest configuration that meets the SLO wins; every loser says why."""

from __future__ import annotations

import pytest

from vlmserve.errors import UserError
from vlmserve.hardware.calibration import Calibration, Efficiency
from vlmserve.plan.search import SearchSpace, parse_prices, run_search, runners_up
from vlmserve.spec import SLO, LoadSpec

CALIBRATION = Calibration(Efficiency(bandwidth=0.7, compute=0.5, step_overhead_s=0.002))
LOAD = LoadSpec(input_len=512, output_len=64, rate=12.0, num_requests=80)
SLO_SPEC = SLO.parse("ttft_p95=400ms,tpot_p95=40ms")


def _space(**overrides) -> SearchSpace:
    fields = dict(
        model="llama-3.1-8b", gpus=["h100", "l40s", "l4"], tps=[1, 2], replicas=[1, 2, 3], max_num_seqs=[64], max_gpus=4
    )
    fields.update(overrides)
    return SearchSpace(**fields)


def test_search_picks_the_cheapest_config_meeting_the_slo() -> None:
    prices = parse_prices("h100=3.0,l40s=1.0,l4=0.5")
    outcome = run_search(_space(), LOAD, SLO_SPEC, prices=prices, calibration=CALIBRATION, prune=False)
    meeting = [c for c in outcome.candidates if c.status == "meets"]
    assert outcome.best is not None and meeting
    assert outcome.best.cost_per_hour == min(c.cost_per_hour for c in meeting)
    # brute force agrees: no cheaper candidate meets the SLO
    cheaper = [c for c in outcome.candidates if c.cost_per_hour < outcome.best.cost_per_hour and c.status == "meets"]
    assert not cheaper
    statuses = {c.status for c in outcome.candidates}
    assert "misses" in statuses  # e.g. one L4 cannot keep up
    assert "over budget" in statuses  # 2 × TP2 × 3 > 4 GPUs
    for candidate in runners_up(outcome, limit=20):
        assert candidate.reason, candidate.label
    missed = [c for c in outcome.candidates if c.status == "misses"]
    assert any("ttft_p95" in c.reason or "overloaded" in c.reason or "tpot_p95" in c.reason for c in missed)


def test_pruning_keeps_the_same_winner_with_fewer_simulations() -> None:
    prices = parse_prices("h100=3.0,l40s=1.0,l4=0.5")
    full = run_search(_space(), LOAD, SLO_SPEC, prices=prices, calibration=CALIBRATION, prune=False)
    pruned = run_search(_space(), LOAD, SLO_SPEC, prices=prices, calibration=CALIBRATION, prune=True)
    assert pruned.best.label == full.best.label
    assert pruned.simulated < full.simulated


def test_model_that_does_not_fit_is_reported_not_simulated() -> None:
    outcome = run_search(
        _space(model="llama-3.1-70b", gpus=["l40s"], tps=[1, 2], replicas=[1]), LOAD, SLO_SPEC, prices={}, calibration=CALIBRATION
    )
    assert all(c.status == "does not fit" for c in outcome.candidates)
    assert all("GiB missing" in c.reason for c in outcome.candidates)
    assert outcome.best is None


def test_bad_search_inputs() -> None:
    with pytest.raises(UserError, match="--price has no price for l4"):
        run_search(_space(), LOAD, SLO_SPEC, prices=parse_prices("h100=3,l40s=1"), calibration=CALIBRATION)
    with pytest.raises(UserError, match="--slo is required"):
        run_search(_space(), LOAD, SLO(), prices={}, calibration=CALIBRATION)
    with pytest.raises(UserError, match="--price: 'h100' has no '='"):
        parse_prices("h100")
    with pytest.raises(UserError, match="'cheap' for h100 is not a number"):
        parse_prices("h100=cheap")
    with pytest.raises(UserError, match="unknown GPU 'x9'"):
        parse_prices("x9=1")
