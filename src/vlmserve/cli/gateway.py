"""`vlmserve gateway`: wiring from flags to `GatewayConfig` and `serve_forever`."""

from __future__ import annotations

import logging
from typing import Any

import typer

from vlmserve.cli.gateway_options import GATEWAY
from vlmserve.cli.model_options import GROUP, with_groups
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.shared_state import parse_state_url


@with_groups(GATEWAY)
def gateway(settings: dict[str, Any] = GROUP) -> None:
    """OpenAI-compatible router across engine replicas (load- and cache-aware, with admission control)."""
    from vlmserve.gateway.server import serve_forever
    from vlmserve.gateway.workers import check_workers, serve_workers

    workers = settings["workers"]
    check_workers(workers)
    config = GatewayConfig(**GATEWAY.fields(settings))
    config.validate()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def ready(bound_port: int) -> None:
        typer.echo(f"vlmserve gateway listening on {listening_line(config, bound_port, workers)}", err=True)

    if workers > 1:
        serve_workers(config, workers, on_ready=ready)
    else:
        serve_forever(config, on_ready=ready)


def listening_line(config: GatewayConfig, bound_port: int, workers: int) -> str:
    """Where the gateway listens and how it routes, for its one start-up line."""
    scheme = "https" if config.ssl_certfile else "http"
    shared = f", limits shared through {parse_state_url(config.state).redacted}" if config.state else ""
    discovering = f", discovering {config.discover}" if config.discover else ""
    several = f", {workers} workers" if workers > 1 else ""
    return (
        f"{scheme}://{config.host}:{bound_port} ({config.policy}, {len(config.replicas)} static replica(s)"
        f"{discovering}{several}{shared})"
    )


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
