"""The gateway's public surface: one table of every path it answers, and the path checks.

The rules this module keeps:
- The raw request target (what the client sent, before anything decodes or normalises
  it) is what is checked and looked up. A path with a dot segment (`.`, `..`), an
  encoded dot, slash or backslash (`%2e`, `%2f`, `%5c`, either case), a backslash, an empty
  segment (`//`) or a fragment is refused with 400 before any handler runs.
- Only paths in `ROUTES`, matched exactly, are answered; everything else is 404 and a known
  path with the wrong method is 405, all in the OpenAI error format. Nothing is forwarded by
  prefix, so an engine's internals (/metrics, /debug/*, /docs, /openapi.json, /load,
  /reset_prefix_cache, /sleep, LoRA loading, ...) are never reachable through the gateway.
- A route is forwarded to the engine under its own table path, never the client's spelling.
- Every route of kind ENGINE_WORK passes the full admission (key, tenant limits, in-flight cap,
  priority queue), the body limits, the media policy, the metrics and the audit log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from vlmserve.gateway.openai_errors import Refusal


class RouteKind(Enum):
    GATEWAY = "gateway"  # answered by the gateway itself (/health, /metrics); no key needed
    MODELS = "models"  # answered by the gateway from the replicas' model lists; key needed
    ENGINE_INFO = "engine_info"  # a cheap GET forwarded to one healthy replica; key needed
    ENGINE_WORK = "engine_work"  # a JSON POST that makes an engine work; full admission
    ADMIN = "admin"  # the gateway applies it to every replica; admin key only (adapter_admin.py)


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    kind: RouteKind
    generates: bool = False  # produces output tokens (counted against token budgets as such)
    streams: bool = False  # honours "stream": true (SSE); otherwise answered as one JSON body


_GET, _POST = "GET", "POST"
_WORK = RouteKind.ENGINE_WORK

ROUTES: dict[str, Route] = {
    route.path: route
    for route in (
        Route("/health", _GET, RouteKind.GATEWAY),
        Route("/metrics", _GET, RouteKind.GATEWAY),
        Route("/v1/models", _GET, RouteKind.MODELS),
        Route("/version", _GET, RouteKind.ENGINE_INFO),
        # Generation.
        Route("/v1/chat/completions", _POST, _WORK, generates=True, streams=True),
        Route("/v1/completions", _POST, _WORK, generates=True, streams=True),
        Route("/v1/responses", _POST, _WORK, generates=True, streams=True),
        # Pooling models (vLLM serves these for embedding, classification and reranking models).
        Route("/v1/embeddings", _POST, _WORK),
        Route("/pooling", _POST, _WORK),
        Route("/classify", _POST, _WORK),
        Route("/score", _POST, _WORK),
        Route("/v1/score", _POST, _WORK),
        Route("/rerank", _POST, _WORK),
        Route("/v1/rerank", _POST, _WORK),
        Route("/v2/rerank", _POST, _WORK),
        # Tokenizer helpers: /tokenize renders chat messages, media included, so it is engine work too.
        Route("/tokenize", _POST, _WORK),
        Route("/detokenize", _POST, _WORK),
        # Runtime LoRA adapters, on every replica (the engines' own /v1/load_lora_adapter stays unreachable).
        Route("/admin/lora/load", _POST, RouteKind.ADMIN),
        Route("/admin/lora/unload", _POST, RouteKind.ADMIN),
        Route("/admin/engine-metrics", _GET, RouteKind.ADMIN),  # the replicas' /metrics, merged (engine_metrics_admin.py)
    )
}
"""Every public path. Not forwarded on purpose: GET/DELETE /v1/responses/{id} (state lives in
one replica), /v1/audio/* (multipart bodies the gateway does not inspect), and every engine
internal."""

_ENCODED_SEPARATOR = re.compile(r"%(?:2e|2f|5c)", re.IGNORECASE)


class RouteRefused(Refusal):
    """The request target is not a public path."""


def target_path(raw_target: str) -> str:
    """The path of a raw HTTP request target, refused (RouteRefused 400) unless it is canonical."""
    if raw_target in ROUTES:  # exactly a table path (all canonical): the common case, nothing to check
        return raw_target
    target = raw_target
    if not target.startswith("/"):  # absolute-form, as sent to proxies: http://host/path
        scheme, sep, rest = target.partition("://")
        if not sep or scheme.lower() not in ("http", "https"):
            raise RouteRefused(400, "the request target must be a path such as /v1/chat/completions", "invalid_path")
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    path = target.split("?", 1)[0]
    problem = (
        "a backslash or '#'"
        if "\\" in path or "#" in path
        else "an encoded '.', '/' or '\\'"
        if _ENCODED_SEPARATOR.search(path)
        else "an empty segment ('//')"
        if "//" in path
        else "a '.' or '..' segment"
        if any(segment in (".", "..") for segment in path.split("/"))
        else None
    )
    if problem is not None:
        raise RouteRefused(
            400, f"path {path[:80]!r} contains {problem}: send the plain path, e.g. /v1/chat/completions", "invalid_path"
        )
    return path


def find_route(path: str, method: str) -> Route:
    """The table's route for a checked path and method; RouteRefused 404/405 otherwise."""
    route = ROUTES.get(path)
    if route is None:
        raise RouteRefused(404, f"no such endpoint {path[:80]!r}: see docs/gateway.md for the public paths", "not_found")
    allowed = (route.method, "HEAD") if route.method == _GET else (route.method,)
    if method not in allowed:
        raise RouteRefused(405, f"{path} accepts {route.method} only", "method_not_allowed")
    return route


def resolve(method: str, raw_target: str) -> Route:
    """The route of a request, from its raw target and method; RouteRefused (400/404/405) otherwise.
    HEAD is taken where GET is (the server sends the head only)."""
    return find_route(target_path(raw_target), method)
