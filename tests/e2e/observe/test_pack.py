"""`vlmserve observe export`: files are valid for promtool and built from the one query table."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vlmserve.observe import queries as q
from vlmserve.observe.alerts import AlertSettings, alert_rules, build_alerts
from vlmserve.observe.dashboards import DASHBOARD_FILTERS, GRAFANA_RATE_WINDOW

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'; scripts/ci-system-deps installs it)"
)


def export(vlmserve_cmd: list[str], out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*vlmserve_cmd, "observe", "export", "--out", str(out), *args], capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_promtool_accepts_rules_and_config(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    spec = tmp_path / "deploy.yaml"
    spec.write_text("name: clinic\nengine: sim\nreplicas: 3\nport: 9100\n")
    done = export(vlmserve_cmd, tmp_path / "pack", "-f", str(spec), "--ttft-slo", "300ms")
    assert done.returncode == 0, done.stderr
    rules = subprocess.run(
        [PROMTOOL, "check", "rules", str(tmp_path / "pack" / "vlmserve-alerts.yaml")], capture_output=True, text=True, timeout=60
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 8 rules found" in rules.stdout
    config = subprocess.run(
        [PROMTOOL, "check", "config", str(tmp_path / "pack" / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert config.returncode == 0, config.stdout + config.stderr
    prometheus = yaml.safe_load((tmp_path / "pack" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in prometheus["scrape_configs"]}
    assert targets == {q.GATEWAY_JOB: ["127.0.0.1:9100"], q.ENGINE_JOB: ["127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103"]}
    ttft = next(
        rule
        for rule in yaml.safe_load((tmp_path / "pack" / "vlmserve-alerts.yaml").read_text())["groups"][0]["rules"]
        if rule["alert"] == "VlmserveTTFTAboveSLO"
    )
    assert ttft["expr"].endswith("> 0.3")


def test_dashboards_use_only_the_query_table(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    assert export(vlmserve_cmd, tmp_path).returncode == 0
    known = {query.render(GRAFANA_RATE_WINDOW, DASHBOARD_FILTERS) for panel in q.all_panels() for query in panel.queries}
    for name, panels in (("grafana-engines.json", q.ENGINE_PANELS), ("grafana-gateway.json", q.GATEWAY_PANELS)):
        board = json.loads((tmp_path / name).read_text())
        exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
        assert set(exprs) <= known and len(board["panels"]) == len(panels)
        assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])


def test_dashboards_narrow_every_selector_to_one_deployment(tmp_path: Path, vlmserve_cmd: list[str]) -> None:
    """Two deployments in one Prometheus must not merge: every series a panel reads is filtered."""
    assert export(vlmserve_cmd, tmp_path).returncode == 0
    metric = re.compile(r"(vllm:[a-z0-9_]+|vlmserve_gateway_[a-z0-9_]+|\bup\b)(\{[^}]*\})?")
    for name in ("grafana-engines.json", "grafana-gateway.json"):
        board = json.loads((tmp_path / name).read_text())
        variables = {variable["name"]: variable for variable in board["templating"]["list"]}
        assert variables["deployment"]["includeAll"] is False
        for expr in (target["expr"] for panel in board["panels"] for target in panel["targets"]):
            for found in metric.finditer(expr):
                assert 'deployment=~"$deployment"' in (found.group(2) or ""), f"{name}: {found.group(0)} in {expr}"
                if found.group(1).startswith("vllm:"):
                    assert 'model_name=~"$model"' in found.group(2), f"{name}: {found.group(0)}"
    engines = json.loads((tmp_path / "grafana-engines.json").read_text())
    assert [v["name"] for v in engines["templating"]["list"]] == ["datasource", "deployment", "model"]
    gateway = json.loads((tmp_path / "grafana-gateway.json").read_text())
    assert [v["name"] for v in gateway["templating"]["list"]] == ["datasource", "deployment"]  # no model label there


def test_current_vllm_metric_names_only() -> None:
    """Shipped dashboards elsewhere break on renamed metrics; guard against the old names."""
    texts = [query.expr for panel in q.all_panels() for query in panel.queries]
    texts += [rule["expr"] for rule in alert_rules(AlertSettings())["groups"][0]["rules"]]
    joined = "\n".join(texts)
    assert "time_per_output_token_seconds" not in joined
    assert "vllm:gpu_cache_usage_perc" not in joined  # renamed to kv_cache_usage_perc
    for counter in (q.VLLM_PREFIX_HITS, q.VLLM_PREEMPTIONS, q.VLLM_REQUEST_SUCCESS, q.VLLM_GENERATION_TOKENS):
        assert counter.endswith("_total")


def test_alert_settings_reach_the_rules() -> None:
    settings = AlertSettings(ttft_slo_s=0.25, queue_backlog=3, kv_cache_full=0.8, for_override="0s", window="30s")
    rules = {rule["alert"]: rule for rule in alert_rules(settings)["groups"][0]["rules"]}
    assert len(rules) == len(build_alerts(settings))
    assert rules["VlmserveTTFTAboveSLO"]["expr"].endswith("> 0.25")
    assert "[30s]" in rules["VlmserveTTFTAboveSLO"]["expr"]
    assert rules["VlmserveQueueBacklog"]["expr"].endswith("> 3")
    assert rules["VlmserveKVCacheNearFull"]["expr"].endswith("> 0.8")
    assert all(rule["for"] == "0s" for rule in rules.values())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ttft-slo", "fast"], "--ttft-slo: 'fast' is not a duration"),
        (["--window", "5 minutes"], "--window: '5 minutes' is not a Prometheus duration"),
        (["--alert-for", "1.5m"], "--alert-for: '1.5m' is not a Prometheus duration"),
        (["-f", "/nonexistent/deploy.yaml"], "no such file"),
    ],
)
def test_bad_flags_are_one_line(tmp_path: Path, vlmserve_cmd: list[str], args: list[str], message: str) -> None:
    done = export(vlmserve_cmd, tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
