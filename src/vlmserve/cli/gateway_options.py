"""The flags of `vlmserve gateway`, one per GatewayConfig setting, declared once (cli.model_options).

Each flag's default is the setting's (GatewayConfig), its name the setting's (`connect_timeout_s`
-> `--connect-timeout`); `config_argv` (gateway.config) writes a config back as these flags, the
way `vlmserve up` starts its gateway.
"""

from __future__ import annotations

import typer

from vlmserve.cli.model_options import Flag, OptionGroup, model_option
from vlmserve.gateway.config import POLICY_NAMES, GatewayConfig
from vlmserve.gateway.shared_state import STATE_ENV, UNAVAILABLE_MODES


def comma_list(values: list[str]) -> list[str]:
    """A repeatable flag whose values may also be comma-separated: every item, stripped, none empty."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _blank_as_none(value: str) -> str | None:
    return value or None


GATEWAY = OptionGroup(
    "settings",
    {
        "replicas": model_option(
            GatewayConfig,
            "replicas",
            "-r",
            help="Base URL of an engine replica (repeat for each); static, beside --discover.",
            default=[],
        ),
        "discover": model_option(
            GatewayConfig,
            "discover",
            help="Replicas that come and go: file:PATH (URLs, one a line, or a YAML/JSON list), dns:NAME:PORT (a headless Service's A/AAAA records) or k8s:NAMESPACE/SERVICE[:PORTNAME] (its EndpointSlices). New ones are routed to after their health check; removed ones drain.",
        ),
        "discover_interval_s": model_option(
            GatewayConfig, "discover_interval_s", help="Seconds between reads of the --discover source."
        ),
        "host": model_option(GatewayConfig, "host", help="Address to listen on."),
        "port": model_option(GatewayConfig, "port", help="Port to listen on."),
        "workers": Flag(
            typer.Option(
                1,
                help="Gateway processes sharing the port (SO_REUSEPORT), 1-64: one core each. "
                "Limits, rate limits and breakers are per worker (docs/gateway.md).",
            ),
            int,
        ),
        "policy": model_option(GatewayConfig, "policy", help=f"Routing policy: {', '.join(POLICY_NAMES)}."),
        "keys_file": model_option(
            GatewayConfig, "keys_file", help="YAML file of tenants and API keys; without it the gateway is open."
        ),
        "audit_log": model_option(GatewayConfig, "audit_log", help="Append one JSON line per request to this file."),
        "log_content": model_option(
            GatewayConfig, "log_content", help="Include prompts (and image references) in the audit log.", pair=True
        ),
        "max_body_bytes": model_option(GatewayConfig, "max_body_bytes", help="Refuse larger request bodies with 413."),
        "connect_timeout_s": model_option(GatewayConfig, "connect_timeout_s", help="Seconds to connect to a replica."),
        "first_token_timeout_s": model_option(
            GatewayConfig, "first_token_timeout_s", help="Seconds to wait for a replica's first byte (retryable)."
        ),
        "idle_chunk_timeout_s": model_option(
            GatewayConfig, "idle_chunk_timeout_s", help="Seconds a stream may stall before it is ended with an error event."
        ),
        "max_attempts": model_option(
            GatewayConfig, "max_attempts", help="Replicas tried per request (retries happen before the first byte only)."
        ),
        "max_in_flight": model_option(
            GatewayConfig,
            "max_in_flight",
            help="Requests in flight to the engines at once; the rest queue by priority (0 = no cap).",
        ),
        "queue_limit_interactive": model_option(
            GatewayConfig, "queue_limit_interactive", help="Interactive requests that may wait before 429."
        ),
        "queue_limit_batch": model_option(GatewayConfig, "queue_limit_batch", help="Batch requests that may wait before 429."),
        "prefix_load_factor": model_option(
            GatewayConfig, "prefix_load_factor", help="prefix-affinity: how far over its fair share a replica may go."
        ),
        "health_interval_s": model_option(GatewayConfig, "health_interval_s", help="Seconds between active health checks."),
        "metrics_interval_s": model_option(
            GatewayConfig, "metrics_interval_s", help="engine-aware: seconds between engine /metrics polls."
        ),
        "replica_api_key": model_option(
            GatewayConfig, "replica_api_key", help="API key the replicas expect.", envvar="VLMSERVE_REPLICA_API_KEY"
        ),
        "drain_timeout_s": model_option(
            GatewayConfig, "drain_timeout_s", help="On shutdown, seconds to let requests in progress finish."
        ),
        "max_ejection_fraction": model_option(
            GatewayConfig,
            "max_ejection_fraction",
            help="Most replicas passive ejection may remove at once, as a fraction (rounded down: 1 replica is never ejected); beyond it, every replica passing its health check is routed to.",
        ),
        "header_timeout_s": model_option(
            GatewayConfig,
            "header_timeout_s",
            help="Seconds a client has to send complete request headers (and a TLS handshake) before 408 and close.",
        ),
        "keepalive_timeout_s": model_option(
            GatewayConfig, "keepalive_timeout_s", help="Seconds an idle kept-alive client connection stays open."
        ),
        "max_connections": model_option(
            GatewayConfig,
            "max_connections",
            help="Client connections open at once; one more is answered 503 and closed (0 = no cap).",
        ),
        "ssl_certfile": model_option(
            GatewayConfig, "ssl_certfile", help="PEM certificate (chain): serve HTTPS (with --ssl-keyfile)."
        ),
        "ssl_keyfile": model_option(GatewayConfig, "ssl_keyfile", help="PEM private key (unencrypted) of --ssl-certfile."),
        "allowed_media_domains": model_option(
            GatewayConfig,
            "allowed_media_domains",
            help="Host whose media URLs may reach the engines (exact hostname; repeat or comma-separate). "
            "Without it only inline data: URLs pass.",
            parse=comma_list,
        ),
        "allow_internal_media_addresses": model_option(
            GatewayConfig,
            "allow_internal_media_addresses",
            help="Let --allowed-media-domains hosts resolve to loopback, private, link-local or metadata addresses "
            "(an internal image server, on purpose). Without it such a host is refused (400).",
        ),
        "max_json_depth": model_option(GatewayConfig, "max_json_depth", help="Refuse bodies nested deeper (400)."),
        "max_json_items": model_option(
            GatewayConfig, "max_json_items", help="Refuse bodies with more JSON values: objects, arrays, elements (400)."
        ),
        "max_image_bytes": model_option(
            GatewayConfig, "max_image_bytes", help="Refuse a larger image (400); checked before decoding."
        ),
        "max_image_pixels": model_option(
            GatewayConfig, "max_image_pixels", help="Refuse an image with more pixels (400); read from its header, never decoded."
        ),
        "max_images_per_request": model_option(
            GatewayConfig, "max_images_per_request", help="Refuse a request with more images or other media parts (400)."
        ),
        "media_fetch_timeout_s": model_option(
            GatewayConfig, "media_fetch_timeout_s", help="Seconds to fetch an allowed remote image (it is then forwarded inline)."
        ),
        "image_downscale_max_side": model_option(
            GatewayConfig,
            "image_downscale_max_side",
            help="Resize images so their longest side is at most this many pixels (the engine's prompt tokens drop accordingly).",
        ),
        "image_workers": model_option(
            GatewayConfig,
            "image_workers",
            help="Processes that resize images for --image-downscale-max-side (never the event loop).",
        ),
        "image_work_budget_s": model_option(
            GatewayConfig,
            "image_work_budget_s",
            help="CPU seconds of image-worker time one request's images may take; over it the request is refused (400).",
        ),
        "model_config_dir": model_option(
            GatewayConfig,
            "model_config_dir",
            help="The served model's directory (config.json, processor configs): per-model image token estimates and downscale rule.",
        ),
        "client_mm_processor_kwargs": model_option(
            GatewayConfig,
            "client_mm_processor_kwargs",
            help="mm_processor_kwargs keys clients may send (repeat or comma-separate); others are refused (400).",
            parse=comma_list,
        ),
        "state": model_option(
            GatewayConfig,
            "state",
            help="Share tenants' rate limits and token budgets with every gateway process and instance through "
            "Redis: redis://[:PASSWORD@]HOST[:PORT][/DB] (rediss:// for TLS). Without it each process keeps its own.",
            envvar=STATE_ENV,
            parse=_blank_as_none,
        ),
        "state_unavailable": model_option(
            GatewayConfig,
            "state_unavailable",
            help=f"When Redis does not answer: {' or '.join(UNAVAILABLE_MODES)}. open admits on per-process limits "
            "and keeps serving; closed refuses rate-limited tenants' requests with 503.",
        ),
        "state_timeout_s": model_option(
            GatewayConfig, "state_timeout_s", help="Seconds a Redis call may take before Redis counts as unreachable."
        ),
        "otlp_traces_endpoint": model_option(
            GatewayConfig,
            "otlp_traces_endpoint",
            help="Export OpenTelemetry spans (request, admission, queue, each attempt, relay) over OTLP/HTTP to this collector URL, e.g. http://127.0.0.1:4318/v1/traces; engines' spans join the same traces. Off without it.",
            parse=_blank_as_none,
        ),
        "trace_sample_ratio": model_option(
            GatewayConfig,
            "trace_sample_ratio",
            help="Share of new traces kept (0-1); a request carrying a traceparent follows its sampled flag.",
        ),
    },
)
"""Every `vlmserve gateway` flag, in its --help order (`workers` is the command's own: processes, not a setting)."""
