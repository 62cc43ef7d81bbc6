"""Deployment hygiene: free ports before a start, and proof that an endpoint serves what was asked.

Two ways sweeps silently lie: an engine fails to start (or worse, the bench talks to a
*different* engine) because another process still holds the port, and a warm endpoint
still serves its previous configuration. Both are checked before any cell runs.
"""

from __future__ import annotations

import httpx

from vlmserve.deploy.processes import free_port_block, port_is_free
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject
from vlmserve.spec import DeploymentSpec


def ports_of(spec: DeploymentSpec) -> list[int]:
    """Every port a deployment will listen on: the gateway's (when it has one) and the replicas'."""
    ports = list(spec.replica_ports())
    if spec.gateway:
        ports.insert(0, spec.port)
    return ports


def with_free_ports(spec: DeploymentSpec, attempts: int = 50) -> DeploymentSpec:
    """A copy of spec on a free block of consecutive ports, unless the user fixed its ports themselves."""
    if {"port", "replica_base_port"} & spec.model_fields_set:
        return spec
    width = spec.replicas + 1
    try:
        base = free_port_block(width, spec.host, attempts)
    except RuntimeError:
        raise UserError(f"could not find {width} free consecutive ports on {spec.host}; free some ports and retry") from None
    return spec.model_copy(update={"port": base, "replica_base_port": base + 1})


def check_ports_free(spec: DeploymentSpec) -> None:
    """Refuse to start a deployment whose ports are taken (another engine still running?)."""
    for port in ports_of(spec):
        if not port_is_free(spec.host, port):
            raise UserError(
                f"port {port} on {spec.host} is already in use (another engine still running?); "
                "stop that process, or remove port:/replica_base_port: from the deployment so the sweep picks free ports"
            )


def served_models(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[JSONObject]:
    """GET /v1/models; an unreachable endpoint is one clear line."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise UserError(
            f"endpoint {base_url} is unreachable ({type(err).__name__}: {err or 'no answer'}); "
            "check the URL and that the server is running"
        ) from None
    if response.status_code != 200:
        raise UserError(f"endpoint {base_url}/v1/models answered HTTP {response.status_code}; is it OpenAI-compatible?")
    try:
        return list(response.json().get("data") or [])
    except (ValueError, AttributeError):
        raise UserError(f"endpoint {base_url}/v1/models did not answer JSON; is it OpenAI-compatible?") from None


def verify_serving(base_url: str, model: str, max_model_len: int | None = None) -> JSONObject:
    """Check the endpoint serves `model` (and `max_model_len`, when the server reports one); return its entry."""
    models = served_models(base_url)
    ids = [str(entry.get("id")) for entry in models]
    match = next((entry for entry in models if entry.get("id") == model), None)
    if match is None:
        raise UserError(
            f"endpoint {base_url} serves {', '.join(ids) or 'no model'}, not '{model}' (a previous deployment still running?)"
        )
    reported = match.get("max_model_len")
    if max_model_len is not None and isinstance(reported, (int, float, str)) and int(reported) != max_model_len:
        raise UserError(
            f"endpoint {base_url} serves '{model}' with max_model_len {reported}, not {max_model_len} "
            "(still serving a previous configuration?)"
        )
    return match


def server_version(base_url: str) -> str | None:
    """The server's own version string (vLLM answers GET /version), or None."""
    try:
        response = httpx.get(f"{base_url}/version", timeout=5.0)
        if response.status_code == 200:
            return str(response.json().get("version"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return None
