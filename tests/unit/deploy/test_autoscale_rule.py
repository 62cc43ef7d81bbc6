"""The autoscaling rule: the HPA algorithm `up` runs, and one definition for `up` and KEDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vlmserve.autoscale import AutoscaleDecider, AutoscaleRule
from vlmserve.cli.up import build_spec, with_autoscale_bounds
from vlmserve.deploy.autoscaler import Autoscaler, gateway_replicas
from vlmserve.deploy.members_file import check_autoscale, write_members_file
from vlmserve.deploy.supervisor import Supervisor
from vlmserve.errors import UserError
from vlmserve.export.k8s import K8sOptions, render_manifests, rule_from_keda
from vlmserve.observe.alerts import AlertSettings
from vlmserve.spec import DeploymentSpec, load_deployment_spec

RULE = AutoscaleRule(
    min_replicas=1,
    max_replicas=4,
    waiting_per_replica=5,
    polling_interval_s=1,
    scale_up_stabilization_s=0,
    scale_down_stabilization_s=10,
    scale_down_cooldown_s=5,
    scale_up_step=4,
)


def run(decider: AutoscaleDecider, readings: list[tuple[float, float]], current: int) -> list[tuple[float, int, str]]:
    """Feed (time, waiting) readings, carrying out every change at once; (time, count, direction) each."""
    seen = []
    for now, waiting in readings:
        decision = decider.decide(now, waiting, current)
        if decision.target != current:
            decider.scaled(now, current, decision.target)
            current = decision.target
        seen.append((now, current, decision.direction))
    return seen


def test_scale_up_is_immediate_and_proportional_to_the_queue() -> None:
    decider = AutoscaleDecider(RULE)
    assert run(decider, [(0, 0), (1, 12)], current=1) == [(0, 1, "hold"), (1, 3, "up")]  # ceil(12 / 5) = 3


def test_the_count_stays_within_bounds_and_within_the_tolerance() -> None:
    assert RULE.raw_desired(1000, 1) == 4 and RULE.raw_desired(0, 3) == 1
    assert RULE.raw_desired(10.5, 2) == 2  # 10.5 / (5 x 2) = 1.05: inside the HPA's 10 % tolerance
    assert RULE.raw_desired(11.5, 2) == 3


def test_scale_down_waits_the_stabilisation_window_then_one_per_cool_down() -> None:
    decider = AutoscaleDecider(RULE)
    readings = [(0, 20)] + [(t, 0) for t in range(1, 30)]
    seen = run(decider, readings, current=1)
    downs = [(t, n) for t, n, direction in seen if direction == "down"]
    # wished for 4 at t=0: nothing below 4 until the window (10 s) has passed; then one per 5 s
    assert downs == [(11, 3), (16, 2), (21, 1)]


def test_a_burst_inside_the_window_keeps_the_replicas() -> None:
    decider = AutoscaleDecider(RULE)
    readings = [(0, 20), (5, 0), (8, 20), (12, 0), (17, 0)]
    assert all(n == 4 for _, n, _ in run(decider, readings, current=1))


def test_scale_up_is_limited_per_polling_interval() -> None:
    rule = RULE.model_copy(update={"scale_up_step": 1})
    decision = AutoscaleDecider(rule).decide(0, 100, 1)
    assert decision.target == 2 and "at most 1 added per 1 s" in decision.reason


def test_up_and_keda_run_one_rule(tmp_path: Path) -> None:
    """`up -f spec --autoscale 1:4` and `export k8s -f spec` read one definition: the ScaledObject,
    read back field by field, is the rule up's autoscaler runs, on the metric it reads."""
    spec_file = tmp_path / "deploy.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "clinic",
                "engine": "sim",
                "model": "sim-model",
                "sim": {"ttft_ms": 5},
                "autoscale": {
                    "min_replicas": 2,
                    "max_replicas": 3,
                    "waiting_per_replica": 3,
                    "polling_interval_s": 2,
                    "scale_down_stabilization_s": 120,
                    "scale_down_cooldown_s": 30,
                    "scale_up_step": 2,
                },
            }
        )
    )
    up_spec = with_autoscale_bounds(build_spec(spec_file, {}, {}), "1:4")
    supervisor = Supervisor(up_spec, state_dir=tmp_path / "state")
    up_rule = Autoscaler(supervisor, up_spec.autoscale, say=lambda line: None).rule  # what `up` runs
    exported_spec = load_deployment_spec(spec_file).model_copy(update={"autoscale": up_spec.autoscale})
    scaled = render_manifests(exported_spec, K8sOptions(), AlertSettings())["engine-scaledobject.yaml"]["spec"]
    assert rule_from_keda(scaled) == up_rule
    assert up_rule.min_replicas == 1 and up_rule.max_replicas == 4 and up_rule.scale_up_step == 2
    assert scaled["triggers"][0]["metadata"]["query"].startswith(f"sum({up_rule.metric}{{")
    assert scaled["triggers"][0]["metricType"] == "AverageValue"


def test_export_without_autoscale_keeps_its_defaults() -> None:
    spec = DeploymentSpec.model_validate({"engine": "sim", "replicas": 2, "sim": {"ttft_ms": 5}})
    scaled = render_manifests(spec, K8sOptions(), AlertSettings())["engine-scaledobject.yaml"]["spec"]
    rule = rule_from_keda(scaled)
    assert (rule.min_replicas, rule.max_replicas, rule.waiting_per_replica) == (2, 8, AutoscaleRule().waiting_per_replica)


@pytest.mark.hostile("up --autoscale with a malformed or inverted MIN:MAX")
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4", "--autoscale 4: '4' is not MIN:MAX; write it like 1:4"),
        ("a:b", "--autoscale a:b: 'a:b' is not MIN:MAX; write it like 1:4"),
        ("4:1", "--autoscale 4:1: Value error, max_replicas 1 is below min_replicas 4"),
        ("0:2", "--autoscale 0:2: Input should be greater than or equal to 1"),
    ],
)
def test_bad_autoscale_flag_is_one_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        with_autoscale_bounds(DeploymentSpec.model_validate({"engine": "sim"}), text)
    assert caught.value.message == message


@pytest.mark.hostile("autoscale without the gateway, or beside gateway_discover")
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"gateway": False}, "autoscale needs the gateway"),
        ({"gateway_discover": "dns:engines.local:8000"}, "autoscale and gateway_discover both set the gateway's replicas"),
    ],
)
def test_autoscale_settings_up_cannot_run_are_refused(extra: dict, message: str) -> None:
    spec = DeploymentSpec.model_validate({"engine": "sim", "autoscale": {"max_replicas": 2}, **extra})
    with pytest.raises(UserError, match=message):
        check_autoscale(spec)


def test_members_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "members.txt"
    write_members_file(path, ["http://127.0.0.1:9001", "http://127.0.0.1:9002"])
    write_members_file(path, ["http://127.0.0.1:9001"])
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["http://127.0.0.1:9001"] and list(tmp_path.iterdir()) == [path]


def test_gateway_view_reads_routable_and_draining_replicas() -> None:
    page = (
        'vlmserve_gateway_in_flight{replica="127.0.0.1:9001"} 0.0\n'
        'vlmserve_gateway_in_flight{replica="127.0.0.1:9002"} 3.0\n'
        'vlmserve_gateway_replica_healthy{replica="127.0.0.1:9001"} 1.0\n'
        'vlmserve_gateway_replica_healthy{replica="127.0.0.1:9002"} 0.0\n'
    )
    assert gateway_replicas(page) == {"127.0.0.1:9001": True, "127.0.0.1:9002": False}
