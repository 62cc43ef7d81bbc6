"""`vlmserve gateway`: wiring from flags to `GatewayConfig` and `serve_forever`."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Optional

import typer

from vlmserve.gateway.config import (ALLOW_INTERNAL_MEDIA_FLAG, ALLOWED_MEDIA_DOMAINS_FLAG, CLIENT_MM_PROCESSOR_KWARGS,
                                     GATEWAY_FILE_FLAGS, MEDIA_POLICY_FLAGS, POLICY_NAMES, GatewayConfig)
from vlmserve.gateway.shared_state import (STATE_ENV, STATE_FLAG, STATE_TIMEOUT_FLAG, STATE_UNAVAILABLE_FLAG,
                                           UNAVAILABLE_MODES, parse_state_url)
from vlmserve.observe.tracing import OTLP_TRACES_ENDPOINT_FLAG, TRACE_SAMPLE_RATIO_FLAG

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GatewayConfig)}


def register(app: typer.Typer) -> None:
    @app.command("gateway")
    def gateway(
        replica: list[str] = typer.Option([], "--replica", "-r", help="Base URL of an engine replica (repeat for each); static, beside --discover."),
        discover: Optional[str] = typer.Option(None, help="Replicas that come and go: file:PATH (URLs, one a line, or a YAML/JSON list), dns:NAME:PORT (a headless Service's A/AAAA records) or k8s:NAMESPACE/SERVICE[:PORTNAME] (its EndpointSlices). New ones are routed to after their health check; removed ones drain."),
        discover_interval: float = typer.Option(_DEFAULTS["discover_interval_s"], help="Seconds between reads of the --discover source."),
        host: str = typer.Option("127.0.0.1", help="Address to listen on."),
        port: int = typer.Option(8080, help="Port to listen on."),
        workers: int = typer.Option(1, help="Gateway processes sharing the port (SO_REUSEPORT), 1-64: one core each. "
                                            "Limits, rate limits and breakers are per worker (docs/gateway.md)."),
        policy: str = typer.Option("least-outstanding-tokens", help=f"Routing policy: {', '.join(POLICY_NAMES)}."),
        keys_file: Path | None = typer.Option(None, GATEWAY_FILE_FLAGS["keys_file"], help="YAML file of tenants and API keys; without it the gateway is open."),
        audit_log: Path | None = typer.Option(None, GATEWAY_FILE_FLAGS["audit_log"], help="Append one JSON line per request to this file."),
        log_content: bool = typer.Option(False, help="Include prompts (and image references) in the audit log."),
        max_body_bytes: int = typer.Option(32 * 1024 * 1024, help="Refuse larger request bodies with 413."),
        connect_timeout: float = typer.Option(3.0, help="Seconds to connect to a replica."),
        first_token_timeout: float = typer.Option(300.0, help="Seconds to wait for a replica's first byte (retryable)."),
        idle_chunk_timeout: float = typer.Option(60.0, help="Seconds a stream may stall before it is ended with an error event."),
        max_attempts: int = typer.Option(3, help="Replicas tried per request (retries happen before the first byte only)."),
        max_in_flight: int = typer.Option(0, help="Requests in flight to the engines at once; the rest queue by priority (0 = no cap)."),
        queue_limit_interactive: int = typer.Option(1024, help="Interactive requests that may wait before 429."),
        queue_limit_batch: int = typer.Option(4096, help="Batch requests that may wait before 429."),
        prefix_load_factor: float = typer.Option(1.25, help="prefix-affinity: how far over its fair share a replica may go."),
        health_interval: float = typer.Option(1.0, help="Seconds between active health checks."),
        metrics_interval: float = typer.Option(0.5, help="engine-aware: seconds between engine /metrics polls."),
        replica_api_key: str | None = typer.Option(None, envvar="VLMSERVE_REPLICA_API_KEY", help="API key the replicas expect."),
        drain_timeout: float = typer.Option(30.0, help="On shutdown, seconds to let requests in progress finish."),
        # Trust boundary (defaults live in GatewayConfig).
        max_ejection_fraction: float = typer.Option(_DEFAULTS["max_ejection_fraction"], help="Most replicas passive ejection may remove at once, as a fraction (rounded down: 1 replica is never ejected); beyond it, every replica passing its health check is routed to."),
        header_timeout: float = typer.Option(_DEFAULTS["header_timeout_s"], help="Seconds a client has to send complete request headers (and a TLS handshake) before 408 and close."),
        keepalive_timeout: float = typer.Option(_DEFAULTS["keepalive_timeout_s"], help="Seconds an idle kept-alive client connection stays open."),
        max_connections: int = typer.Option(_DEFAULTS["max_connections"], help="Client connections open at once; one more is answered 503 and closed (0 = no cap)."),
        ssl_certfile: Path | None = typer.Option(None, GATEWAY_FILE_FLAGS["ssl_certfile"], help="PEM certificate (chain): serve HTTPS (with --ssl-keyfile)."),
        ssl_keyfile: Path | None = typer.Option(None, GATEWAY_FILE_FLAGS["ssl_keyfile"], help="PEM private key (unencrypted) of --ssl-certfile."),
        allowed_media_domains: list[str] = typer.Option(
            [], ALLOWED_MEDIA_DOMAINS_FLAG,
            help="Host whose media URLs may reach the engines (exact hostname; repeat or comma-separate). "
                 "Without it only inline data: URLs pass."),
        allow_internal_media_addresses: bool = typer.Option(
            _DEFAULTS["allow_internal_media_addresses"], ALLOW_INTERNAL_MEDIA_FLAG,
            help="Let --allowed-media-domains hosts resolve to loopback, private, link-local or metadata addresses "
                 "(an internal image server, on purpose). Without it such a host is refused (400)."),
        max_json_depth: int = typer.Option(_DEFAULTS["max_json_depth"], help="Refuse bodies nested deeper (400)."),
        max_json_items: int = typer.Option(_DEFAULTS["max_json_items"],
                                           help="Refuse bodies with more JSON values: objects, arrays, elements (400)."),
        max_image_bytes: int = typer.Option(_DEFAULTS["max_image_bytes"], MEDIA_POLICY_FLAGS["max_image_bytes"], help="Refuse a larger image (400); checked before decoding."),
        max_image_pixels: int = typer.Option(_DEFAULTS["max_image_pixels"], MEDIA_POLICY_FLAGS["max_image_pixels"], help="Refuse an image with more pixels (400); read from its header, never decoded."),
        max_images_per_request: int = typer.Option(_DEFAULTS["max_images_per_request"], MEDIA_POLICY_FLAGS["max_images_per_request"], help="Refuse a request with more images or other media parts (400)."),
        media_fetch_timeout: float = typer.Option(_DEFAULTS["media_fetch_timeout_s"], help="Seconds to fetch an allowed remote image (it is then forwarded inline)."),
        image_downscale_max_side: Optional[int] = typer.Option(None, MEDIA_POLICY_FLAGS["image_downscale_max_side"], help="Resize images so their longest side is at most this many pixels (the engine's prompt tokens drop accordingly)."),
        image_workers: int = typer.Option(_DEFAULTS["image_workers"], help="Processes that resize images for --image-downscale-max-side (never the event loop)."),
        image_work_budget: float = typer.Option(_DEFAULTS["image_work_budget_s"], help="CPU seconds of image-worker time one request's images may take; over it the request is refused (400)."),
        model_config_dir: Optional[Path] = typer.Option(None, help="The served model's directory (config.json, processor configs): per-model image token estimates and downscale rule."),
        client_mm_processor_kwargs: list[str] = typer.Option(
            list(CLIENT_MM_PROCESSOR_KWARGS), "--client-mm-processor-kwargs",
            help="mm_processor_kwargs keys clients may send (repeat or comma-separate); others are refused (400)."),
        state: Optional[str] = typer.Option(
            None, STATE_FLAG, envvar=STATE_ENV,
            help="Share tenants' rate limits and token budgets with every gateway process and instance through "
                 "Redis: redis://[:PASSWORD@]HOST[:PORT][/DB] (rediss:// for TLS). Without it each process keeps its own."),
        state_unavailable: str = typer.Option(
            _DEFAULTS["state_unavailable"], STATE_UNAVAILABLE_FLAG,
            help=f"When Redis does not answer: {' or '.join(UNAVAILABLE_MODES)}. open admits on per-process limits "
                 "and keeps serving; closed refuses rate-limited tenants' requests with 503."),
        state_timeout: float = typer.Option(_DEFAULTS["state_timeout_s"], STATE_TIMEOUT_FLAG,
                                            help="Seconds a Redis call may take before Redis counts as unreachable."),
        otlp_traces_endpoint: Optional[str] = typer.Option(
            _DEFAULTS["otlp_traces_endpoint"], OTLP_TRACES_ENDPOINT_FLAG,
            help="Export OpenTelemetry spans (request, admission, queue, each attempt, relay) over OTLP/HTTP to this "
                 "collector URL, e.g. http://127.0.0.1:4318/v1/traces; engines' spans join the same traces. Off without it."),
        trace_sample_ratio: float = typer.Option(
            _DEFAULTS["trace_sample_ratio"], TRACE_SAMPLE_RATIO_FLAG,
            help="Share of new traces kept (0-1); a request carrying a traceparent follows its sampled flag."),
    ) -> None:
        """OpenAI-compatible router across engine replicas (load- and cache-aware, with admission control)."""
        from vlmserve.gateway.server import serve_forever
        from vlmserve.gateway.workers import check_workers, serve_workers

        check_workers(workers)

        config = GatewayConfig(
            replicas=replica, host=host, port=port, policy=policy, keys_file=keys_file, audit_log=audit_log,
            log_content=log_content, max_body_bytes=max_body_bytes, connect_timeout_s=connect_timeout,
            first_token_timeout_s=first_token_timeout, idle_chunk_timeout_s=idle_chunk_timeout,
            max_attempts=max_attempts, max_in_flight=max_in_flight, queue_limit_interactive=queue_limit_interactive,
            queue_limit_batch=queue_limit_batch, prefix_load_factor=prefix_load_factor,
            health_interval_s=health_interval, metrics_interval_s=metrics_interval,
            replica_api_key=replica_api_key, drain_timeout_s=drain_timeout,
            max_ejection_fraction=max_ejection_fraction, header_timeout_s=header_timeout,
            keepalive_timeout_s=keepalive_timeout, max_connections=max_connections,
            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
            allowed_media_domains=[host.strip() for value in allowed_media_domains for host in value.split(",") if host.strip()],
            allow_internal_media_addresses=allow_internal_media_addresses,
            max_json_depth=max_json_depth, max_json_items=max_json_items,
            max_image_bytes=max_image_bytes, max_image_pixels=max_image_pixels,
            max_images_per_request=max_images_per_request, media_fetch_timeout_s=media_fetch_timeout,
            image_downscale_max_side=image_downscale_max_side, model_config_dir=model_config_dir,
            image_workers=image_workers, image_work_budget_s=image_work_budget,
            client_mm_processor_kwargs=[key.strip() for value in client_mm_processor_kwargs for key in value.split(",") if key.strip()],
            discover=discover, discover_interval_s=discover_interval,
            state=state or None, state_unavailable=state_unavailable, state_timeout_s=state_timeout,
            otlp_traces_endpoint=otlp_traces_endpoint or None, trace_sample_ratio=trace_sample_ratio,
        )
        config.validate()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

        def ready(bound_port: int) -> None:
            scheme = "https" if ssl_certfile else "http"
            shared = f", limits shared through {parse_state_url(config.state).redacted}" if config.state else ""
            typer.echo(f"vlmserve gateway listening on {scheme}://{host}:{bound_port} ({policy}, {len(replica)} static replica(s){', discovering ' + discover if discover else ''}"
                       f"{f', {workers} workers' if workers > 1 else ''}{shared})", err=True)

        if workers > 1:
            serve_workers(config, workers, on_ready=ready)
        else:
            serve_forever(config, on_ready=ready)
