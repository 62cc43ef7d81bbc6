"""Runtime LoRA loading and unloading through the gateway: an admin key only, applied to every replica.

`POST /admin/lora/load {"lora_name": N, "lora_path": P}` and `POST /admin/lora/unload {"lora_name": N}`
are the gateway's own paths (the engines' `/v1/load_lora_adapter` stays unreachable from outside,
routes.py). A tenant with `admin: true` in the keys file may call them; any other key gets 403, an
open gateway (no keys file) has no admin. The call goes to every replica in the set, one after
another, and the answer names each replica's outcome (200 when all took it, 502 otherwise); the
replicas' model lists are re-read at once, so the adapter is routable when the answer arrives.
Loading touches no request in flight. Unloading an adapter this gateway process has requests in
flight for is refused (409): it would cut them. The engines need VLLM_ALLOW_RUNTIME_LORA_UPDATING
(`up` sets it on replicas behind a gateway when the spec turns LoRA on).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from vlmserve.gateway.admission import AdmissionRejected
from vlmserve.gateway.openai_errors import error_response
from vlmserve.gateway.replicas import fetch_whole
from vlmserve.http1.messages import Request, Response
from vlmserve.spec import ADAPTER_NAME

if TYPE_CHECKING:
    from vlmserve.gateway.app import Gateway

ENGINE_PATHS = {"/admin/lora/load": "/v1/load_lora_adapter", "/admin/lora/unload": "/v1/unload_lora_adapter"}
REPLICA_TIMEOUT_S = 120.0
"""Per replica: loading reads the adapter's weights from disk."""


def _request_fields(path: str, body: bytes) -> dict[str, str]:
    """The engine's request body, checked: a valid adapter name, and a path to load from."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    name = payload.get("lora_name") if isinstance(payload, dict) else None
    if not isinstance(name, str) or not ADAPTER_NAME.fullmatch(name):
        raise AdmissionRejected(
            400, "give a JSON object with 'lora_name': 1 to 64 letters, digits, '-', '_' or '.'", "invalid_lora_name"
        )
    if path.endswith("/unload"):
        return {"lora_name": name}
    source = payload.get("lora_path")
    if not isinstance(source, str) or not source.startswith("/") or len(source) > 4096:
        raise AdmissionRejected(
            400, "give 'lora_path': the adapter's absolute directory on the replicas' machines", "invalid_lora_path"
        )
    return {"lora_name": name, "lora_path": source}


async def handle_adapter_admin(gateway: Gateway, request: Request) -> Response:
    """The admin route: authenticate, check, apply to every replica, report each one (a refusal
    before any replica is the Refusal Gateway.dispatch answers)."""
    tenant = gateway.admission.tenant_for(request.headers)
    if not tenant.admin:
        raise AdmissionRejected(
            403, "loading and unloading adapters needs an admin key (a keys-file tenant with admin: true)", "admin_required"
        )
    fields = _request_fields(request.path, request.body)
    busy = gateway.adapters.in_flight.get(fields["lora_name"], 0)
    if request.path.endswith("/unload") and busy:
        raise AdmissionRejected(
            409,
            f"adapter {fields['lora_name']!r} has {busy} request(s) in flight here: "
            "unloading would cut them; retry when they are done",
            "adapter_in_use",
        )
    outcomes = await asyncio.gather(*(_apply(gateway, replica, request.path, fields) for replica in gateway.pool.replicas))
    results = {replica.name: outcome for replica, outcome in zip(gateway.pool.replicas, outcomes)}
    failed = {name: outcome for name, outcome in results.items() if outcome != "ok"}
    if failed:
        detail = "; ".join(f"{name}: {outcome}" for name, outcome in failed.items())
        return error_response(
            502, f"{request.path} failed on {len(failed)} of {len(results)} replica(s): {detail}", "adapter_update_failed"
        )
    return Response.json({"lora_name": fields["lora_name"], "replicas": results})


async def _apply(gateway: Gateway, replica: Any, path: str, fields: dict[str, str]) -> str:
    """One replica's outcome: 'ok', or why not (its own error message, shortened)."""
    assert gateway.upstream is not None
    try:
        answer, body = await fetch_whole(
            gateway.upstream,
            "POST",
            replica.url + ENGINE_PATHS[path],
            gateway.admin_headers,
            json.dumps(fields).encode(),
            REPLICA_TIMEOUT_S,
        )
        await gateway.pool._refresh_models(replica)  # routable (or gone) when the answer arrives
    except (OSError, TimeoutError) as err:
        return f"{type(err).__name__}"
    return "ok" if answer.status == 200 else f"HTTP {answer.status}: {body[:200].decode('utf-8', 'replace')}"
