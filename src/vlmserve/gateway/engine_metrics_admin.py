"""`GET /admin/engine-metrics`: the replicas' own /metrics pages as one, for readers behind the gateway.

The bench (and an operator's Prometheus) see the engines' figures — prefix cache, KV usage,
preemptions — through the one address they have. Each sample is labelled `replica="<url>"`
(prometheus_text.merge_pages). Every replica the gateway routes to is read at once through the
probes' client, each within the probe timeout and prometheus_text.MAX_PAGE_BYTES; one that fails is
left out and named in a comment line; the merge runs off the event loop. With a keys file only an
admin key may read it (the engines' figures show every tenant's traffic); an open gateway serves it
as it serves its own /metrics.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from vlmserve import prometheus_text
from vlmserve.gateway.admission import AdmissionRejected
from vlmserve.gateway.openai_errors import error_response
from vlmserve.http1.messages import Request, Response

if TYPE_CHECKING:
    from vlmserve.gateway.app import Gateway

PATH = prometheus_text.GATEWAY_PATH


async def handle_engine_metrics(gateway: Gateway, request: Request) -> Response:
    """Authenticate, read the routable replicas' pages together, answer them merged."""
    try:
        if not gateway.admission.open and not gateway.admission.tenant_for(request.headers).admin:
            raise AdmissionRejected(403, "the engines' metrics need an admin key (a keys-file tenant with admin: true)",
                                    "admin_required")
    except AdmissionRejected as refused:
        return error_response(refused.status, refused.message, refused.code)
    replicas = gateway.pool.candidates(None)
    probes = await asyncio.gather(*(gateway.pool._probe_status(replica, "/metrics") for replica in replicas))
    pages = [(replica.url, body) for replica, (body, _) in zip(replicas, probes) if body is not None]
    failed = [(replica.url, why) for replica, (body, why) in zip(replicas, probes) if body is None]
    merged = await asyncio.to_thread(lambda: prometheus_text.merge_pages(pages, "replica", failed).encode())
    return Response(200, merged, {"Content-Type": prometheus_text.CONTENT_TYPE})
