"""The endpoint under test, and the checks made before any load is sent.

A bench that starts hammering a wrong URL or model wastes minutes and prints a wall of
failures; so the URL's reachability, the model's presence in /v1/models and one tiny
streamed request are checked first, each failing as one line that says what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

from vlmserve.bench.client import RequestOptions, build_body
from vlmserve.engines.sim import SIM_ENGINE_NAME
from vlmserve.errors import UserError

PROBE_ATTEMPTS = 5
"""Tries of the pre-flight test request when the server answers 5xx or 429."""


@dataclass
class Target:
    """An OpenAI-compatible endpoint: base URL (with or without /v1), model, optional API key."""

    base_url: str
    model: str
    api_key: str | None = None

    def __post_init__(self) -> None:
        url = self.base_url.strip().rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        if not url.startswith(("http://", "https://")):
            raise UserError(f"--base-url '{self.base_url}': give a URL like http://127.0.0.1:8000")
        self.base_url = url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class ServerFacts:
    """What the pre-flight learned about the server."""

    models: list[str]
    server_version: str | None
    per_chunk_usage: bool
    notes: list[str] = field(default_factory=list)
    simulated: bool = False
    """The server said it is vlmserve's sim engine: its figures are simulated, not measured."""


def _get(client: httpx.Client, url: str) -> httpx.Response:
    try:
        return client.get(url)
    except httpx.ConnectError:
        raise UserError(f"cannot reach {url}: connection refused; is the server running? check --base-url") from None
    except httpx.TimeoutException:
        raise UserError(f"{url} did not answer within the time limit; check --base-url and the server") from None
    except httpx.HTTPError as err:
        raise UserError(f"cannot reach {url}: {type(err).__name__}; check --base-url") from None


def check_target(target: Target, options: RequestOptions, timeout_s: float = 10.0) -> ServerFacts:
    """Reachability, model listed, server version, and whether per-chunk usage works."""
    with httpx.Client(timeout=timeout_s, headers=target.headers) as client:
        models_url = f"{target.base_url}/v1/models"
        response = _get(client, models_url)
        if response.status_code in (401, 403):
            raise UserError(f"{models_url} answered HTTP {response.status_code}; give a valid --api-key")
        if response.status_code != 200:
            raise UserError(f"{models_url} answered HTTP {response.status_code}; is --base-url an OpenAI-compatible server?")
        try:
            models = [str(entry["id"]) for entry in response.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{models_url} did not return an OpenAI model list; check --base-url") from None
        if target.model not in models:
            served = ", ".join(models[:8]) or "none"
            raise UserError(f"model '{target.model}' is not served at {target.base_url} (it serves: {served}); fix --model")
        version, engine = _server_version(client, target, response)
        per_chunk = _probe(client, target, options)
    return ServerFacts(models=models, server_version=version, per_chunk_usage=per_chunk, simulated=engine == SIM_ENGINE_NAME)


def _server_version(client: httpx.Client, target: Target, models_response: httpx.Response) -> tuple[str | None, str | None]:
    """(version, engine) from /version; the engine name is how a sim engine identifies itself."""
    try:
        response = client.get(f"{target.base_url}/version")
        if response.status_code == 200:
            data = response.json()
            if isinstance(data, dict) and data.get("version"):
                return str(data["version"]), (str(data["engine"]) if data.get("engine") else None)
    except (httpx.HTTPError, ValueError):
        pass
    return models_response.headers.get("server"), None


def _probe(client: httpx.Client, target: Target, options: RequestOptions) -> bool:
    """Send one tiny streamed request; True when the server accepts per-chunk usage stats."""
    url = f"{target.base_url}{options.path}"
    last_error = ""
    for per_chunk in (options.per_chunk_usage, False) if options.per_chunk_usage else (False,):
        probe_options = RequestOptions(**{**options.__dict__, "per_chunk_usage": per_chunk, "ignore_eos": False})
        body = build_body(probe_options, 1, messages=[{"role": "user", "content": "hi"}], prompt="hi")
        for _attempt in range(PROBE_ATTEMPTS):  # a server error may be transient (or injected)
            try:
                response = client.post(url, json=body)
            except httpx.HTTPError as err:
                raise UserError(f"{url}: a test request failed ({type(err).__name__}); check the server") from None
            if response.status_code < 500 and response.status_code != 429:
                break
        if response.status_code == 200:
            return per_chunk
        last_error = _message(response)
    raise UserError(f"{url} rejected a test request: HTTP {response.status_code}: {last_error}; check --api and --extra-body")


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
        error = data.get("error", data) if isinstance(data, dict) else data
        text = error.get("message", json.dumps(error)) if isinstance(error, dict) else str(error)
    except ValueError:
        text = response.text
    return " ".join(str(text).split())[:200]
