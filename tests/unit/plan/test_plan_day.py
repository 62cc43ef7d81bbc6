"""`plan day`: the autoscaling rule over a traffic shape, simulated, against fixed replicas."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmserve.autoscale import AutoscaleRule
from vlmserve.bench.load_shapes import parse_load_shape
from vlmserve.cli.app import main
from vlmserve.plan.day import ReplicaModel, plan_day, simulate

RULE = AutoscaleRule(
    min_replicas=1,
    max_replicas=4,
    waiting_per_replica=5,
    polling_interval_s=1,
    scale_down_stabilization_s=60,
    scale_down_cooldown_s=5,
)
STEP = parse_load_shape("steps:2@20,20@70,2@90")
REPLICA = ReplicaModel(slots=8, ttft_s=0.05, itl_s=0.01, output_len=64)


def test_a_longer_cold_start_lowers_attainment() -> None:
    attainment = [simulate(STEP, REPLICA, 1.0, rule=RULE, cold_start_s=cold, seed=1).attainment for cold in (2, 20, 60)]
    assert attainment[0] > attainment[1] > attainment[2], attainment
    assert attainment[0] > 0.9 and attainment[2] < 0.5, attainment


def test_the_rule_scales_up_for_the_step_and_back_down_after_it() -> None:
    result = simulate(STEP, REPLICA, 1.0, rule=RULE, cold_start_s=20, seed=1)
    counts = [count for _, count in result.timeline]
    assert counts[0] == 1 and max(counts) == 4 and counts[-1] == 1, result.timeline
    assert result.scale_ups >= 1 and result.scale_downs == 3
    up_at = next(at for at, count in result.timeline if count > 1)
    assert 20 <= up_at < 30  # the step is at 20 s; the queue passes the threshold within seconds


def test_fixed_at_peak_holds_the_slo_and_fixed_at_mean_does_not() -> None:
    plan = plan_day(STEP, RULE, REPLICA, 1.0, 20, price_per_replica_hour=2.0, seed=1)
    assert plan.fixed_peak.attainment == 1.0 and plan.fixed_peak.peak_replicas == 2  # 20 req/s / 11.76 per replica
    assert plan.fixed_mean.attainment < 0.5 and plan.fixed_mean.peak_replicas == 1
    # cost: replica-seconds (until the last answer, just after the shape's 180 s) at the price, scaled to a day
    assert plan.fixed_peak.cost == pytest.approx(2 * 180 / 3600 * 2.0, rel=0.01)
    assert plan.fixed_peak.cost_per_day == pytest.approx(2 * 24 * 2.0, rel=0.01)
    assert plan.autoscaled.replica_seconds > plan.fixed_mean.replica_seconds


def test_the_cli_reports_every_strategy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "day.csv"
    trace.write_text("0,1\n600,20\n1200,2\n1800,0\n")
    main(
        [
            "plan",
            "day",
            "--load-shape",
            f"trace:{trace}",
            "--autoscale",
            "1:4",
            "--cold-start-s",
            "30",
            "--price",
            "2",
            "--json-out",
            str(tmp_path / "day.json"),
        ]
    )
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "autoscaled" in out and "fixed at peak (2)" in out and "fixed at mean (1)" in out
    assert '"simulated": true' in (tmp_path / "day.json").read_text()


@pytest.mark.hostile("plan day with an SLO that has no TTFT bound, or a negative cold start")
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slo", "e2e_p95=5s"], "error: --slo e2e_p95=5s: plan day holds each request to a TTFT bound"),
        (["--cold-start-s", "-3"], "error: --cold-start-s -3: give 0 or more"),
        (["--ttft-ms", "0", "--itl-ms", "0"], "error: --ttft-ms and --itl-ms are both 0"),
    ],
)
def test_bad_plan_day_flags_are_one_line(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["plan", "day", "--load-shape", "steps:2@10", *flags])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith(message), err
    assert len(err.strip().splitlines()) == 1
