"""Prometheus scrape configuration for a `vlmserve up` deployment on one machine."""

from __future__ import annotations

from vlmserve.observe.queries import DEPLOYMENT_LABEL, ENGINE_JOB, GATEWAY_JOB
from vlmserve.spec import DeploymentSpec


def _reachable_host(host: str) -> str:
    """A listen address Prometheus can dial: wildcard binds are scraped on loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def scrape_targets(spec: DeploymentSpec) -> tuple[list[str], list[str]]:
    """(gateway targets, engine targets) as host:port for the deployment."""
    host = _reachable_host(spec.host)
    gateway = [f"{host}:{spec.port}"] if spec.gateway else []
    engines = [f"{host}:{port}" for port in spec.replica_ports()]
    return gateway, engines


def prometheus_config(
    gateway_targets: list[str],
    engine_targets: list[str],
    *,
    deployment: str,
    scrape_interval: str = "15s",
    rule_files: list[str] | None = None,
) -> dict[str, object]:
    """A complete prometheus.yml (as a dict) scraping the gateway and the engines."""
    labels = {DEPLOYMENT_LABEL: deployment}
    scrape_configs = []
    if gateway_targets:
        scrape_configs.append(
            {
                "job_name": GATEWAY_JOB,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": gateway_targets, "labels": labels}],
            }
        )
    scrape_configs.append(
        {"job_name": ENGINE_JOB, "metrics_path": "/metrics", "static_configs": [{"targets": engine_targets, "labels": labels}]}
    )
    config: dict[str, object] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": scrape_configs,
    }
    if rule_files:
        config["rule_files"] = rule_files
    return config


def prometheus_config_for(
    spec: DeploymentSpec, *, scrape_interval: str = "15s", rule_files: list[str] | None = None
) -> dict[str, object]:
    gateway, engines = scrape_targets(spec)
    return prometheus_config(gateway, engines, deployment=spec.name, scrape_interval=scrape_interval, rule_files=rule_files)
