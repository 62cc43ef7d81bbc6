"""The deployment's front door: the gateway's command line, and who may reach it.

One rule, kept here: a deployment is open to other machines only when its spec says so.
With the gateway on, replicas listen on loopback (`DeploymentSpec.replica_host`), so the
gateway, with its keys, audit log, TLS and media allowlist, is the only way in; a door on a
non-loopback address without keys must be asked for with `open: true` (or `--open`). The
checks run before any engine starts, so a mistake costs a second, not a model load.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from vlmserve.discovery.sources import parse_source
from vlmserve.errors import UserError
from vlmserve.gateway.config import GATEWAY_FILE_FLAGS, MEDIA_POLICY_FLAGS, GatewayConfig, config_argv
from vlmserve.gateway.shared_state import STATE_ENV, parse_state_url
from vlmserve.observe.tracing import DEFAULT_TRACE_SAMPLE_RATIO, check_tracing_settings
from vlmserve.spec import DeploymentSpec


def check_trust_boundary(spec: DeploymentSpec, *, gateway_runs: bool) -> None:
    """Refuse a deployment that would be open to other machines by accident.

    With a gateway the replicas listen on loopback, so the gateway is the only door; a door
    on a non-loopback address without keys must be asked for (`open: true` / `--open`)."""
    gateway_only = [name for name in ("keys_file", "audit_log", "ssl_certfile") if getattr(spec, name)]
    if gateway_only and not gateway_runs:
        raise UserError(
            f"{', '.join(gateway_only)} {'needs' if len(gateway_only) == 1 else 'need'} the gateway, which is off; "
            "set gateway: true (or drop --no-gateway)"
        )
    if spec.loopback_only or spec.open:
        return
    if not gateway_runs:
        raise UserError(
            f"host {spec.host} is reachable from other machines and, without the gateway, nothing asks for keys; "
            "turn the gateway on and set keys_file, or set open: true (or pass --open) to serve it open on purpose"
        )
    if not spec.keys_file:
        raise UserError(
            f"host {spec.host} is reachable from other machines but the gateway has no keys_file; set keys_file "
            "in the spec (or --keys-file), or set open: true (or pass --open) to serve it without keys on purpose"
        )


def check_gateway_files(spec: DeploymentSpec) -> None:
    """The gateway's input files exist, checked before any engine starts (not a minute later)."""
    for name in ("keys_file", "ssl_certfile", "ssl_keyfile"):
        value = getattr(spec, name)
        if value and not Path(value).expanduser().is_file():
            raise UserError(
                f"{name} {value} does not exist; create it or fix the path (relative paths are read next to the spec file)"
            )
    if spec.gateway_discover:
        parse_source(spec.gateway_discover)  # a malformed source stops `up` before any engine starts
    if spec.gateway_state:
        try:
            parse_state_url(spec.gateway_state)  # likewise a malformed Redis URL
        except UserError as err:
            raise UserError(f"gateway_state: {err}") from None
    if spec.gateway_otlp_traces_endpoint:
        try:  # a bad URL, or the SDK missing, stops `up` before any engine starts
            check_tracing_settings(spec.gateway_otlp_traces_endpoint, DEFAULT_TRACE_SAMPLE_RATIO)
        except UserError as err:
            raise UserError(f"gateway_otlp_traces_endpoint: {err}") from None


def gateway_config(spec: DeploymentSpec, replica_urls: list[str], model_dir: str | None = None) -> GatewayConfig:
    """The settings of the gateway in front of the replicas: the spec's trust settings, the rest at the
    gateway's defaults. `model_dir`, when it is a local model directory, lets the gateway price images
    by the model's own processor configuration."""
    files: dict[str, Any] = {name: Path(value).expanduser() for name in GATEWAY_FILE_FLAGS if (value := getattr(spec, name))}
    media: dict[str, Any] = {name: value for name in MEDIA_POLICY_FLAGS if (value := getattr(spec, name)) is not None}
    shared: dict[str, Any] = (
        {"state": spec.gateway_state, "state_unavailable": spec.gateway_state_unavailable} if spec.gateway_state else {}
    )
    tracing: dict[str, Any] = (
        {"otlp_traces_endpoint": spec.gateway_otlp_traces_endpoint} if spec.gateway_otlp_traces_endpoint else {}
    )
    if tracing and spec.gateway_trace_sample_ratio is not None:
        tracing["trace_sample_ratio"] = spec.gateway_trace_sample_ratio
    local_model = model_dir is not None and (Path(model_dir) / "config.json").is_file()
    return GatewayConfig(
        replicas=list(replica_urls),
        host=spec.host,
        port=spec.port,
        policy=spec.gateway_policy,
        allowed_media_domains=list(spec.allowed_media_domains),
        allow_internal_media_addresses=spec.allow_internal_media_addresses,
        discover=spec.gateway_discover or None,
        model_config_dir=Path(model_dir) if local_model and model_dir else None,
        **files,
        **media,
        **shared,
        **tracing,
    )


def gateway_argv(spec: DeploymentSpec, replica_urls: list[str], model_dir: str | None = None) -> list[str]:
    """`python -m vlmserve gateway ...` giving `gateway_config` (the Redis URL travels in gateway_env)."""
    argv = [sys.executable, "-m", "vlmserve", "gateway", *config_argv(gateway_config(spec, replica_urls, model_dir))]
    if spec.gateway_workers != 1:
        argv += ["--workers", str(spec.gateway_workers)]
    return argv


def gateway_env(spec: DeploymentSpec, base: dict[str, str]) -> dict[str, str]:
    """The gateway's environment: `base` plus the settings that must stay out of its argv.

    The shared-state URL may carry a Redis password, and a command line is readable by every
    user of the machine (`ps`), so it travels as VLMSERVE_GATEWAY_STATE. One inherited from the
    shell is dropped: the spec alone decides whether the gateway shares its limits."""
    env = {key: value for key, value in base.items() if key != STATE_ENV}
    if spec.gateway_state:
        env[STATE_ENV] = spec.gateway_state
    return env


def shown_gateway_env(spec: DeploymentSpec) -> dict[str, str]:
    """What `up --print-plan` shows of `gateway_env` (beyond the inherited environment), password hidden."""
    return {STATE_ENV: parse_state_url(spec.gateway_state).redacted} if spec.gateway_state else {}
