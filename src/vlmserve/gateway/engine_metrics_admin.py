"""`GET /admin/engine-metrics`: every routable replica's /metrics, read at once through the probes'
client (probe timeout, MAX_PAGE_BYTES each) and merged off the event loop, each sample labelled
`replica="<url>"` (prometheus_text.py); a failed replica is named in a comment. With a keys file an
admin key only (the engines' figures show every tenant's traffic); open gateway: like /metrics."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from vlmserve import prometheus_text
from vlmserve.gateway.admission import AdmissionRejected
from vlmserve.http1.messages import Request, Response

if TYPE_CHECKING:
    from vlmserve.gateway.app import Gateway

PATH = prometheus_text.GATEWAY_PATH


async def handle_engine_metrics(gateway: Gateway, request: Request) -> Response:
    """Authenticate, read the routable replicas' pages together, answer them merged."""
    if not gateway.admission.open and not gateway.admission.tenant_for(request.headers).admin:  # dispatch answers
        raise AdmissionRejected(
            403, "the engines' metrics need an admin key (a keys-file tenant with admin: true)", "admin_required"
        )
    replicas = gateway.pool.candidates(None)
    probes = await asyncio.gather(*(gateway.pool._probe_status(replica, "/metrics") for replica in replicas))
    pages = [(replica.url, body) for replica, (body, _) in zip(replicas, probes) if body is not None]
    failed = [(replica.url, why) for replica, (body, why) in zip(replicas, probes) if body is None]
    merged = await asyncio.to_thread(lambda: prometheus_text.merge_pages(pages, "replica", failed).encode())
    return Response(200, merged, {"Content-Type": prometheus_text.CONTENT_TYPE})
