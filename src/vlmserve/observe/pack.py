"""Write the observability pack (dashboards, alert rules, scrape config) into a folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from vlmserve.errors import UserError
from vlmserve.observe.alerts import AlertSettings, alert_rules
from vlmserve.observe.dashboards import engine_dashboard, gateway_dashboard
from vlmserve.observe.scrape import prometheus_config_for
from vlmserve.spec import DeploymentSpec

ALERTS_FILE = "vlmserve-alerts.yaml"
PROMETHEUS_FILE = "prometheus.yml"
ENGINE_DASHBOARD_FILE = "grafana-engines.json"
GATEWAY_DASHBOARD_FILE = "grafana-gateway.json"


class _NoAliasDumper(yaml.SafeDumper):
    """Readers of generated config expect plain YAML, not &id001 anchors for repeated dicts."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def to_yaml(data: object) -> str:
    """Plain block YAML in the key order given."""
    return yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False, width=200)


_PROM_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def check_prometheus_duration(flag: str, value: str) -> str:
    """Prometheus durations are integers with a unit (30s, 5m, 1h30m); refuse anything else."""
    if not _PROM_DURATION.match(value):
        raise UserError(f"{flag}: '{value}' is not a Prometheus duration; write it like 30s, 5m or 1h")
    return value


def write_pack(out_dir: Path, spec: DeploymentSpec, settings: AlertSettings, scrape_interval: str = "15s") -> list[Path]:
    """Write every file of the pack; returns the paths written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out: cannot create {out_dir}: {err.strerror}; pick a writable folder") from None
    files = {
        ENGINE_DASHBOARD_FILE: json.dumps(engine_dashboard(), indent=2) + "\n",
        GATEWAY_DASHBOARD_FILE: json.dumps(gateway_dashboard(), indent=2) + "\n",
        ALERTS_FILE: to_yaml(alert_rules(settings)),
        PROMETHEUS_FILE: to_yaml(prometheus_config_for(spec, scrape_interval=scrape_interval, rule_files=[ALERTS_FILE])),
    }
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written
