"""`vlmserve observe export`: write dashboards, alert rules and a scrape config."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vlmserve.errors import UserError
from vlmserve.spec import DeploymentSpec, load_deployment_spec, parse_duration_s

observe_app = typer.Typer(
    help="Observability pack: Grafana dashboards, Prometheus alerts and scrape config.", no_args_is_help=True
)


@observe_app.command("export")
def export(
    out: Path = typer.Option(..., "--out", help="Folder to write the pack into."),
    spec_file: Optional[Path] = typer.Option(None, "-f", "--file", help="Deployment spec (deploy.yaml) whose ports to scrape."),
    ttft_slo: str = typer.Option("500ms", "--ttft-slo", help="p95 time-to-first-token objective."),
    queue_backlog: int = typer.Option(10, "--queue-backlog", min=1, help="Waiting requests per replica that alert."),
    kv_cache_full: float = typer.Option(0.9, "--kv-cache-full", min=0.01, max=1.0, help="KV-cache usage fraction that alerts."),
    preemptions_per_s: float = typer.Option(
        0.5, "--preemptions-per-s", min=0.0, help="Preemptions per second per replica that alert."
    ),
    error_ratio: float = typer.Option(
        0.05, "--error-ratio", min=0.0, max=1.0, help="Share of 5xx answers at the gateway that alerts."
    ),
    window: str = typer.Option("5m", "--window", help="Rate window of the alert expressions."),
    alert_for: Optional[str] = typer.Option(None, "--alert-for", help="Override every alert's 'for:' (e.g. 0s when testing)."),
    scrape_interval: str = typer.Option("15s", "--scrape-interval", help="Prometheus scrape interval."),
) -> None:
    """Write grafana-*.json, vlmserve-alerts.yaml and prometheus.yml into --out."""
    from vlmserve.observe.alerts import AlertSettings
    from vlmserve.observe.pack import check_prometheus_duration, write_pack

    try:
        slo_s = parse_duration_s(ttft_slo)
    except ValueError as err:
        raise UserError(f"--ttft-slo: {err}") from None
    if slo_s <= 0:
        raise UserError("--ttft-slo: must be positive, e.g. 500ms")
    check_prometheus_duration("--window", window)
    check_prometheus_duration("--scrape-interval", scrape_interval)
    if alert_for is not None:
        check_prometheus_duration("--alert-for", alert_for)
    spec = load_deployment_spec(spec_file) if spec_file else DeploymentSpec()
    settings = AlertSettings(
        ttft_slo_s=slo_s,
        queue_backlog=queue_backlog,
        kv_cache_full=kv_cache_full,
        preemptions_per_s=preemptions_per_s,
        error_ratio=error_ratio,
        window=window,
        for_override=alert_for,
    )
    for path in write_pack(out, spec, settings, scrape_interval=scrape_interval):
        typer.echo(f"wrote {path}")
    if spec_file is None:
        typer.echo("note: no -f deploy.yaml given; prometheus.yml scrapes the default ports (gateway 8000, replica 8001)")


def register(app: typer.Typer) -> None:
    app.add_typer(observe_app, name="observe")
