"""The shipped alert rules, tested by behaviour: `promtool test rules` feeds them series and checks
which alerts fire, with what labels and messages (tests/e2e/observe/alert_rules_test.yaml).

promtool evaluates the real rule file on a virtual clock, so `for:` durations and rate windows
are the shipped ones and the whole file runs in about a second.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers.gateway_proc import start_gateway
from tests.helpers.sim import start_sim_engine
from vlmserve.observe import queries as q
from vlmserve.observe.alerts import AlertSettings, alert_rules, build_alerts
from vlmserve.observe.pack import ALERTS_FILE, to_yaml

PROMTOOL = shutil.which("promtool")
CASES = Path(__file__).with_name("alert_rules_test.yaml")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'; scripts/ci-system-deps installs it)"
)


def _cases() -> dict:
    return yaml.safe_load(CASES.read_text())


def test_the_cases_load_the_file_the_pack_writes() -> None:
    assert _cases()["rule_files"] == [ALERTS_FILE]


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for test in _cases()["tests"]:
        for check in test.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {alert.name for alert in build_alerts(AlertSettings())}
    assert names - fires == set(), "alerts never shown firing"
    assert names - silent == set(), "alerts never shown staying silent"


@needs_promtool
def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    (tmp_path / ALERTS_FILE).write_text(to_yaml(alert_rules(AlertSettings())))
    shutil.copy(CASES, tmp_path / CASES.name)
    done = subprocess.run([PROMTOOL, "test", "rules", CASES.name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_signal_with_or_is_compared_as_a_whole() -> None:
    """`a or vector(0) > 0` compares only the fallback; every rule wraps its signal in parentheses."""
    for rule in alert_rules(AlertSettings())["groups"][0]["rules"]:
        assert re.fullmatch(r"\(.*\) [<>] [0-9.e-]+", rule["expr"]), rule["expr"]


@pytest.mark.slow
def test_the_gateway_records_a_broken_stream_as_a_server_failure(tmp_path: Path) -> None:
    """The error-rate rule counts the status the real gateway writes when an engine breaks mid-stream."""
    with (
        start_sim_engine(model="m", ttft_ms=2, itl_ms=1, drop_after_tokens=2) as engine,
        start_gateway([engine.base_url], tmp_path) as gateway,
    ):
        body = {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30) as response:
            assert response.status_code == 200
            try:
                response.read()
            except httpx.HTTPError:
                pass  # the gateway may cut the stream too; either way the status is what matters
        metrics = httpx.get(f"{gateway.base_url}/metrics", timeout=10).text
    statuses = set(re.findall(rf'^{q.GW_REQUESTS}{{[^}}]*status="([^"]+)"', metrics, re.MULTILINE))
    assert statuses, metrics
    assert all(re.fullmatch(q.GW_SERVER_FAILED, status) for status in statuses), statuses
