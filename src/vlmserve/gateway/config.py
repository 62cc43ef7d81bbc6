"""All gateway settings in one place, so the CLI, `vlmserve up` and tests build the same thing."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from vlmserve.errors import UserError, check_listen_port
from vlmserve.discovery.sources import parse_source
from vlmserve.gateway.shared_state import DEFAULT_TIMEOUT_S, check_state_settings
from vlmserve.observe.tracing import DEFAULT_TRACE_SAMPLE_RATIO, check_tracing_settings
from vlmserve.routing import GATEWAY_POLICIES as POLICY_NAMES
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS
from vlmserve.spec import DeploymentSpec


CLIENT_MM_PROCESSOR_KWARGS = ("max_soft_tokens",)
"""The per-request processor kwargs clients may send by default: a vision budget (Gemma-style)."""


# Settings in seconds that must be positive and finite, each named by its flag (_flag).
_POSITIVE_SECONDS = ("connect_timeout_s", "first_token_timeout_s", "idle_chunk_timeout_s", "health_interval_s",
                     "metrics_interval_s", "header_timeout_s", "keepalive_timeout_s", "media_fetch_timeout_s",
                     "discover_interval_s")


GATEWAY_FILE_FLAGS: dict[str, str] = {
    "keys_file": "--keys-file",
    "audit_log": "--audit-log",
    "ssl_certfile": "--ssl-certfile",
    "ssl_keyfile": "--ssl-keyfile",
}
"""The gateway's file flags, by the setting's name (in GatewayConfig and DeploymentSpec alike), written once:
`vlmserve gateway` declares them, `up` (deploy/front_door.py) and `export k8s` write them."""


MEDIA_POLICY_FLAGS: dict[str, str] = {
    "max_image_bytes": "--max-image-bytes",
    "max_image_pixels": "--max-image-pixels",
    "max_images_per_request": "--max-images-per-request",
    "image_downscale_max_side": "--image-downscale-max-side",
}
"""The gateway's image limits, by the setting's name in DeploymentSpec (None there: the gateway's default)."""
ALLOWED_MEDIA_DOMAINS_FLAG = "--allowed-media-domains"
ALLOW_INTERNAL_MEDIA_FLAG = "--allow-internal-media-addresses"


def media_policy_argv(spec: DeploymentSpec) -> list[str]:
    """The gateway flags for a spec's media allowlist and image limits: `up` and `export k8s` pass these same."""
    argv: list[str] = []
    for domain in spec.allowed_media_domains:
        argv += [ALLOWED_MEDIA_DOMAINS_FLAG, domain]
    if spec.allow_internal_media_addresses:
        argv.append(ALLOW_INTERNAL_MEDIA_FLAG)
    for name, flag in MEDIA_POLICY_FLAGS.items():
        number = getattr(spec, name)
        if number is not None:
            argv += [flag, str(number)]
    return argv


def _flag(name: str) -> str:
    """The CLI flag of a seconds setting: connect_timeout_s -> --connect-timeout."""
    return "--" + name.removesuffix("_s").replace("_", "-")


@dataclass
class GatewayConfig:
    """Settings of one gateway process. Defaults suit a few vLLM replicas on one host."""

    replicas: list[str]
    host: str = "127.0.0.1"
    port: int = 8080
    policy: str = LEAST_OUTSTANDING_TOKENS
    keys_file: Path | None = None
    audit_log: Path | None = None
    log_content: bool = False
    # Requests larger than this are refused with 413 before they are read completely.
    max_body_bytes: int = 32 * 1024 * 1024
    # Timeouts (seconds). The first-token one covers queueing inside the engine.
    connect_timeout_s: float = 3.0
    first_token_timeout_s: float = 300.0
    idle_chunk_timeout_s: float = 60.0
    # Retries happen only before the first byte reaches the client.
    max_attempts: int = 3
    retry_budget_ratio: float = 0.2
    retry_budget_min_per_s: float = 5.0
    # Health and ejection.
    health_interval_s: float = 1.0
    metrics_interval_s: float = 0.5
    breaker_failures: int = 3
    breaker_open_s: float = 5.0
    breaker_open_max_s: float = 60.0
    # Admission: how many requests may be in flight to the engines at once (0 = no limit),
    # and how many may wait per priority class before 429.
    max_in_flight: int = 0
    queue_limit_interactive: int = 1024
    queue_limit_batch: int = 4096
    queue_timeout_s: float = 60.0
    # Token estimates used by the load-aware policies (the gateway has no tokenizer).
    chars_per_token: float = 4.0
    image_token_estimate: int = 576
    default_max_tokens: int = 256
    # Prefix affinity: characters per hashed block, and how far over its fair share a
    # replica may go before affinity yields (consistent hashing with bounded loads).
    prefix_block_chars: int = 256
    prefix_load_factor: float = 1.25
    replica_api_key: str | None = None
    drain_timeout_s: float = 30.0
    # Trust boundary: passive ejection never removes more than this share of the replicas
    # (rounded down: one replica is never ejected); beyond it, panic routing (replicas.py).
    max_ejection_fraction: float = 0.5
    # Slow, idle and too many clients (http1/server.py; nginx: client_header_timeout 60 s,
    # keepalive_timeout 75 s). Over max_connections a new connection gets 503 (0 = no cap).
    header_timeout_s: float = 15.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 4096
    # HTTPS (http1/tls.py): both PEM files or neither.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # Trust boundary (routes.py, media/urls.py, json_limits.py). Remote media URLs reach an engine
    # only when their host is listed (exact hostname, as vLLM's --allowed-media-domains);
    # bodies nested deeper or holding more JSON values than these are refused with 400.
    allowed_media_domains: list[str] = field(default_factory=list)
    # A listed host that resolves to a loopback, private, link-local, metadata or other internal
    # address is refused too (media/addresses.py), unless the operator allows that on purpose.
    allow_internal_media_addresses: bool = False
    max_json_depth: int = 64
    max_json_items: int = 100_000
    # Image preflight (media/preflight.py): per-request limits, which a tenant in the keys file may
    # tighten; remote media (allowed hosts only) is fetched here and forwarded inline.
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 64_000_000
    max_images_per_request: int = 16
    media_fetch_timeout_s: float = 10.0
    # Resize images so their longest side is at most this (None: forward them as sent).
    image_downscale_max_side: int | None = None
    # Downscaling runs in this many worker processes (media/workers.py), and one request's
    # images may take at most image_work_budget_s of their CPU time (over it: 400).
    image_workers: int = 2
    image_work_budget_s: float = 5.0
    # The served model's directory (config.json, processor configs): per-model image token
    # estimates and the downscale rule. Without it each image counts image_token_estimate.
    model_config_dir: Path | None = None
    # Per-request mm_processor_kwargs keys a client may send (engines behind the gateway trust
    # them: vLLM's --trust-request-mm-kwargs); any other key is refused with 400.
    client_mm_processor_kwargs: list[str] = field(default_factory=lambda: list(CLIENT_MM_PROCESSOR_KWARGS))
    # Replicas that come and go (vlmserve/discovery): a source read every discover_interval_s, beside
    # the static `replicas` (file:PATH, dns:NAME:PORT or k8s:NAMESPACE/SERVICE[:PORTNAME]).
    discover: str | None = None
    discover_interval_s: float = 5.0
    # Where tenants' rate limits and token budgets live (shared_state.py): None = this process;
    # redis://HOST:PORT/DB = shared by every gateway process and instance. When Redis does not
    # answer within state_timeout_s: "open" admits on per-process limits, "closed" answers 503.
    state: str | None = None
    state_unavailable: str = "open"
    state_timeout_s: float = DEFAULT_TIMEOUT_S
    # OpenTelemetry spans (observe/tracing.py), exported over OTLP/HTTP here (vLLM's flag name); None: off.
    # New traces are kept at this ratio; a client's sampled traceparent decides for its own.
    otlp_traces_endpoint: str | None = None
    trace_sample_ratio: float = DEFAULT_TRACE_SAMPLE_RATIO

    def validate(self) -> None:
        """Reject settings that cannot work, with a message that says what to change."""
        if not self.replicas and not self.discover:
            raise UserError("no replicas given: pass --replica URL at least once (e.g. --replica http://127.0.0.1:8001) "
                            "or --discover SOURCE")
        if self.discover is not None:
            parse_source(self.discover)  # a UserError naming the problem
        check_listen_port(self.port)
        for url in self.replicas:
            if not (url.startswith("http://") or url.startswith("https://")):
                raise UserError(f"replica URL {url!r} must start with http:// or https://")
        if len(set(self.replicas)) != len(self.replicas):
            raise UserError("the same replica URL was given twice: pass each --replica once")
        if self.policy not in POLICY_NAMES:
            raise UserError(f"unknown policy {self.policy!r}: choose one of {', '.join(POLICY_NAMES)}")
        if self.keys_file is not None and not Path(self.keys_file).is_file():
            raise UserError(f"keys file {self.keys_file} does not exist: create it or drop --keys-file")
        check_state_settings(self.state, self.state_unavailable, self.state_timeout_s)
        check_tracing_settings(self.otlp_traces_endpoint, self.trace_sample_ratio)
        if self.max_attempts < 1:
            raise UserError("--max-attempts must be at least 1")
        if self.max_body_bytes < 1:
            raise UserError(f"--max-body-bytes must be at least 1, got {self.max_body_bytes}")
        if not (math.isfinite(self.prefix_load_factor) and self.prefix_load_factor >= 1.0):
            raise UserError("--prefix-load-factor must be at least 1.0 (1.0 = strict fair share)")
        if self.max_json_depth < 2 or self.max_json_items < 1:
            raise UserError("--max-json-depth must be at least 2 and --max-json-items at least 1")
        if not 0.0 <= self.max_ejection_fraction <= 1.0:
            raise UserError("--max-ejection-fraction must be between 0 and 1 (0 = never eject, 1 = any number)")
        if min(self.max_image_bytes, self.max_image_pixels, self.max_images_per_request) < 1:
            raise UserError("--max-image-bytes, --max-image-pixels and --max-images-per-request must be at least 1")
        if not (1 <= self.image_workers <= 64 and 0 < self.image_work_budget_s <= 3600):
            raise UserError("--image-workers must be between 1 and 64, and --image-work-budget between 0 and 3600 seconds")
        if self.image_downscale_max_side is not None and self.image_downscale_max_side < 16:
            raise UserError("--image-downscale-max-side must be at least 16 pixels (or left out to forward images as sent)")
        if self.model_config_dir is not None and not (Path(self.model_config_dir) / "config.json").is_file():
            raise UserError(f"--model-config-dir {self.model_config_dir}: no config.json there; give the served model's directory")
        if min(self.max_in_flight, self.queue_limit_interactive, self.queue_limit_batch) < 0:
            raise UserError("--max-in-flight (0 = no cap), --queue-limit-interactive and --queue-limit-batch must be 0 or more")
        if self.max_connections < 0:
            raise UserError("--max-connections must be 0 (no cap) or more")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise UserError("HTTPS needs both --ssl-certfile and --ssl-keyfile: pass both, or neither for plain HTTP")
        for name in _POSITIVE_SECONDS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):  # NaN passes every comparison; inf never fires
                raise UserError(f"{_flag(name)} must be a positive number of seconds, got {value}")
        if not (math.isfinite(self.drain_timeout_s) and self.drain_timeout_s >= 0):
            raise UserError(f"--drain-timeout must be 0 or more seconds, got {self.drain_timeout_s}")


ENV_ONLY_SETTINGS = ("replica_api_key", "state")
"""Settings that never go on a command line, which every user of the machine can read (`ps`): an API key,
a Redis URL with its password. They travel in the environment (VLMSERVE_REPLICA_API_KEY, VLMSERVE_GATEWAY_STATE)."""


def setting_flag(name: str) -> str:
    """The `vlmserve gateway` flag of a setting: its name with dashes, a unit suffix `_s` dropped
    (`replicas`: `--replica`, one a flag), the rule cli.model_options builds the flags by."""
    return "--replica" if name == "replicas" else _flag(name)


def config_argv(config: GatewayConfig) -> list[str]:
    """The `vlmserve gateway` flags that give `config` back: each setting away from its default
    (settings without a flag must stay at their default; ENV_ONLY_SETTINGS are left out)."""
    argv: list[str] = []
    defaults = GatewayConfig(replicas=[])
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if item.name in ENV_ONLY_SETTINGS or value == getattr(defaults, item.name):
            continue
        flag = setting_flag(item.name)
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, list):
            for each in value:
                argv += [flag, str(each)]
        else:
            argv += [flag, str(value)]
    return argv
