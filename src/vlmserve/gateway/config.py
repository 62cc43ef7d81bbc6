"""All gateway settings in one place, so the CLI, `vlmserve up` and tests build the same thing."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmserve.discovery.sources import parse_source
from vlmserve.errors import UserError, check_listen_port
from vlmserve.gateway.shared_state import DEFAULT_TIMEOUT_S, check_state_settings
from vlmserve.observe.tracing import DEFAULT_TRACE_SAMPLE_RATIO, check_tracing_settings
from vlmserve.routing import GATEWAY_POLICIES as POLICY_NAMES
from vlmserve.routing import LEAST_OUTSTANDING_TOKENS
from vlmserve.spec import DeploymentSpec

CLIENT_MM_PROCESSOR_KWARGS = ("max_soft_tokens",)
"""The per-request processor kwargs clients may send by default: a vision budget (Gemma-style)."""


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


def _in_range(default: Any, low: float, high: float | None = None, *, above: bool = False, note: str = "") -> Any:
    """A number setting's default and its allowed range, `low` (`above`: more than it) to `high`, checked by validate."""
    return field(default=default, metadata={"range": (low, high, above, note)})


def _positive_seconds(default: float, high: float | None = None) -> Any:
    return _in_range(default, 0, high, above=True)


def _check_range(name: str, value: float, low: float, high: float | None, above: bool, note: str) -> None:
    """A one-line error naming the flag unless `value` is finite and in range (NaN fails every comparison)."""
    if math.isfinite(value) and (value > low if above else value >= low) and (high is None or value <= high):
        return
    unit = " seconds" if name.endswith("_s") else ""
    rule = (
        "a positive number of seconds"
        if above and high is None
        else f"more than {low} and at most {high}{unit}"
        if above
        else f"between {low} and {high}{unit}"
        if high is not None
        else f"0 or more{unit}"
        if low == 0
        else f"at least {low}{unit}"
    )
    raise UserError(f"{_flag(name)} must be {rule}{note}, got {value}")


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
    max_body_bytes: int = _in_range(32 * 1024 * 1024, 1)
    # Timeouts (seconds). The first-token one covers queueing inside the engine.
    connect_timeout_s: float = _positive_seconds(3.0)
    first_token_timeout_s: float = _positive_seconds(300.0)
    idle_chunk_timeout_s: float = _positive_seconds(60.0)
    # Retries happen only before the first byte reaches the client.
    max_attempts: int = _in_range(3, 1)
    retry_budget_ratio: float = 0.2
    retry_budget_min_per_s: float = 5.0
    # Health and ejection.
    health_interval_s: float = _positive_seconds(1.0)
    metrics_interval_s: float = _positive_seconds(0.5)
    breaker_failures: int = 3
    breaker_open_s: float = 5.0
    breaker_open_max_s: float = 60.0
    # Admission: how many requests may be in flight to the engines at once (0 = no limit),
    # and how many may wait per priority class before 429.
    max_in_flight: int = _in_range(0, 0, note=" (0 = no cap)")
    queue_limit_interactive: int = _in_range(1024, 0)
    queue_limit_batch: int = _in_range(4096, 0)
    queue_timeout_s: float = 60.0
    # Token estimates used by the load-aware policies (the gateway has no tokenizer).
    chars_per_token: float = 4.0
    image_token_estimate: int = 576
    default_max_tokens: int = 256
    # Prefix affinity: characters per hashed block, and how far over its fair share a
    # replica may go before affinity yields (consistent hashing with bounded loads).
    prefix_block_chars: int = 256
    prefix_load_factor: float = _in_range(1.25, 1.0, note=" (1.0 = strict fair share)")
    replica_api_key: str | None = None
    drain_timeout_s: float = _in_range(30.0, 0)
    # Trust boundary: passive ejection never removes more than this share of the replicas
    # (rounded down: one replica is never ejected); beyond it, panic routing (replicas.py).
    max_ejection_fraction: float = _in_range(0.5, 0.0, 1.0, note=" (0 = never eject, 1 = any number)")
    # Slow, idle and too many clients (http1/server.py; nginx: client_header_timeout 60 s,
    # keepalive_timeout 75 s). Over max_connections a new connection gets 503 (0 = no cap).
    header_timeout_s: float = _positive_seconds(15.0)
    keepalive_timeout_s: float = _positive_seconds(75.0)
    max_connections: int = _in_range(4096, 0, note=" (0 = no cap)")
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
    max_json_depth: int = _in_range(64, 2)
    max_json_items: int = _in_range(100_000, 1)
    # Image preflight (media/preflight.py): per-request limits, which a tenant in the keys file may
    # tighten; remote media (allowed hosts only) is fetched here and forwarded inline.
    max_image_bytes: int = _in_range(20 * 1024 * 1024, 1)
    max_image_pixels: int = _in_range(64_000_000, 1)
    max_images_per_request: int = _in_range(16, 1)
    media_fetch_timeout_s: float = _positive_seconds(10.0)
    # Resize images so their longest side is at most this (None: forward them as sent).
    image_downscale_max_side: int | None = _in_range(None, 16, note=" pixels (or left out to forward images as sent)")
    # Downscaling runs in this many worker processes (media/workers.py), and one request's
    # images may take at most image_work_budget_s of their CPU time (over it: 400).
    image_workers: int = _in_range(2, 1, 64)
    image_work_budget_s: float = _positive_seconds(5.0, 3600)
    # The served model's directory (config.json, processor configs): per-model image token
    # estimates and the downscale rule. Without it each image counts image_token_estimate.
    model_config_dir: Path | None = None
    # Per-request mm_processor_kwargs keys a client may send (engines behind the gateway trust
    # them: vLLM's --trust-request-mm-kwargs); any other key is refused with 400.
    client_mm_processor_kwargs: list[str] = field(default_factory=lambda: list(CLIENT_MM_PROCESSOR_KWARGS))
    # Replicas that come and go (vlmserve/discovery): a source read every discover_interval_s, beside
    # the static `replicas` (file:PATH, dns:NAME:PORT or k8s:NAMESPACE/SERVICE[:PORTNAME]).
    discover: str | None = None
    discover_interval_s: float = _positive_seconds(5.0)
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
            raise UserError(
                "no replicas given: pass --replica URL at least once (e.g. --replica http://127.0.0.1:8001) or --discover SOURCE"
            )
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
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if "range" in item.metadata and value is not None:
                _check_range(item.name, value, *item.metadata["range"])
        if self.model_config_dir is not None and not (Path(self.model_config_dir) / "config.json").is_file():
            raise UserError(
                f"--model-config-dir {self.model_config_dir}: no config.json there; give the served model's directory"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise UserError("HTTPS needs both --ssl-certfile and --ssl-keyfile: pass both, or neither for plain HTTP")


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
