"""The gateway: handlers per route kind, admission, and wiring of the parts.

Which paths exist, and the checks on the raw target, are in routes.py; `Gateway.dispatch` is the
one handler the HTTP server (vlmserve.http1.server) calls for every request: it finds the route
and calls that kind's handler. `Gateway.start` opens the upstream connection pool, checks every
replica once and starts the background tasks; server.py runs it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from vlmserve.discovery.sources import DiscoveryWatcher, parse_source
from vlmserve.gateway.adapter_admin import handle_adapter_admin
from vlmserve.gateway.adapters import AdapterCatalog
from vlmserve.gateway.admission import (
    PRIORITIES,
    Admission,
    AdmissionRejected,
    Charge,
    Tenant,
    admissible_tokens,
    asks_for_usage,
    check_output_limits,
    context_tokens,
    load_keys_file,
    settled_tokens,
)
from vlmserve.gateway.audit import AuditLog
from vlmserve.gateway.config import GatewayConfig
from vlmserve.gateway.engine_metrics_admin import PATH as ENGINE_METRICS_PATH
from vlmserve.gateway.engine_metrics_admin import handle_engine_metrics
from vlmserve.gateway.json_limits import check_json_shape
from vlmserve.gateway.metrics import GatewayMetrics
from vlmserve.gateway.openai_errors import Refusal, error_response
from vlmserve.gateway.proxy import Forwarder, RequestLog
from vlmserve.gateway.replicas import Replica, ReplicaPool, fetch_whole
from vlmserve.gateway.request_info import (
    RoutedRequest,
    TokenEstimator,
    choices_of,
    client_request_id,
    describe_request,
    session_key,
)
from vlmserve.gateway.retry_budget import RetryBudget
from vlmserve.gateway.routes import Route, RouteKind, resolve
from vlmserve.gateway.routing import LeastOutstandingTokens, RoundRobin, RoutingPolicy, SessionAffinity, build_policy
from vlmserve.gateway.shared_state import SharedState
from vlmserve.gateway.watchdog import Watchdog
from vlmserve.http1.client import ClientPool
from vlmserve.http1.headers import header_lines
from vlmserve.http1.messages import Answer, Request, Response
from vlmserve.http1.server import ClientStats
from vlmserve.media.addresses import CheckedResolver, MediaAddressPolicy
from vlmserve.media.preflight import TEXT_ONLY, ImageLimits, ImagePreflight, ImageRefused, PreflightResult, RemoteFetcher
from vlmserve.media.urls import MediaRefused, allowed_host_set, check_media, may_hold_media
from vlmserve.media.workers import ImageWorkerPool
from vlmserve.observe.tracing import gateway_tracing
from vlmserve.vision.probe import load_image_readers
from vlmserve.vision.tokens import estimator_for_model_dir, fallback_estimator

log = logging.getLogger("vlmserve.gateway")

_DRAINING = (503, "gateway is shutting down: retry on another gateway", "draining")
_NO_HEALTHY_REPLICA = (503, "no healthy replica: check the replicas' health (GET /health)", "no_healthy_replica")


@dataclass(slots=True)
class _Held:
    """What admission took for one request, noted as it is taken, given back when the request ends."""

    tenant: Tenant | None = None
    payload: dict[str, Any] | None = None  # the parsed body (the audit log's content)
    adapter: str | None = None  # counted in by AdapterCatalog.check, counted out at the end
    routed: RoutedRequest | None = None
    charged: Charge | None = None  # what the tenant's token budget was charged, settled to the use
    slot: bool = False  # an in-flight slot is held


class Gateway:
    """Everything one running gateway owns."""

    def __init__(self, config: GatewayConfig) -> None:
        config.validate()
        self.config = config
        tenants = load_keys_file(config.keys_file) if config.keys_file else None
        self.metrics = GatewayMetrics(self._snapshot)
        # Only the settings here: the connection is made in start(), inside the serving process.
        self.shared_state = (
            SharedState(
                config.state,
                unavailable=config.state_unavailable,
                timeout_s=config.state_timeout_s,
                on_error=lambda kind: self.metrics.state_errors.labels(kind).inc(),
                on_fallback=lambda mode: self.metrics.state_fallbacks.labels(mode).inc(),
            )
            if config.state
            else None
        )
        self.admission = Admission(
            tenants,
            max_in_flight=config.max_in_flight,
            queue_limits={"interactive": config.queue_limit_interactive, "batch": config.queue_limit_batch},
            queue_timeout_s=config.queue_timeout_s,
            shared=self.shared_state,
        )
        self.policy: RoutingPolicy = build_policy(config)
        self.estimator = TokenEstimator(config.chars_per_token, config.image_token_estimate, config.default_max_tokens)
        image_estimator = (
            estimator_for_model_dir(config.model_config_dir)
            if config.model_config_dir
            else fallback_estimator(config.image_token_estimate)
        )
        log.info("image token estimate: %s", image_estimator.describe())
        self.image_limits = ImageLimits(config.max_image_bytes, config.max_image_pixels, config.max_images_per_request)
        self.preflight = ImagePreflight(
            self.image_limits,
            image_estimator,
            downscale_max_side=config.image_downscale_max_side,
            client_processor_kwargs=tuple(config.client_mm_processor_kwargs),
            pool=ImageWorkerPool(config.image_workers, config.image_work_budget_s)
            if config.image_downscale_max_side is not None
            else None,
        )
        self.media_session: aiohttp.ClientSession | None = None
        self.audit = AuditLog(config.audit_log, log_content=config.log_content)
        self.allowed_media_hosts = allowed_host_set(config.allowed_media_domains)
        self.media_addresses = MediaAddressPolicy(config.allow_internal_media_addresses)
        upstream_headers = {"Authorization": f"Bearer {config.replica_api_key}"} if config.replica_api_key else {}
        self.replica_headers = header_lines(upstream_headers.items())  # what a forwarded GET carries
        self.admin_headers = header_lines([("Content-Type", "application/json"), *upstream_headers.items()])
        self.pool = ReplicaPool(
            config.replicas,
            health_interval_s=config.health_interval_s,
            metrics_interval_s=config.metrics_interval_s if self.policy.uses_engine_load else None,
            breaker_failures=config.breaker_failures,
            breaker_open_s=config.breaker_open_s,
            breaker_open_max_s=config.breaker_open_max_s,
            max_ejection_fraction=config.max_ejection_fraction,
            upstream_headers=upstream_headers,
            on_load_update=self.policy.on_load_update,
            on_ejection=lambda replica: self.metrics.ejections.labels(replica.name).inc(),
            on_forget=self._forget_replica,
        )
        self.adapters = AdapterCatalog(self.pool, self.metrics.registry)
        self.discovery: DiscoveryWatcher | None = None
        if config.discover:
            self.discovery = DiscoveryWatcher(
                parse_source(config.discover),
                config.discover_interval_s,
                self._apply_discovered,
                lambda reason: self.metrics.discovery_errors.labels(reason).inc(),
            )
        self.client_stats = ClientStats()  # filled by the HTTP server (http1/server.py)
        self.watchdog = Watchdog()
        self.tracing = gateway_tracing(config.otlp_traces_endpoint, config.trace_sample_ratio)  # None: off
        self.upstream: ClientPool | None = None
        self.forwarder: Forwarder | None = None
        self._engine_info_rotation = RoundRobin()
        self.draining = False
        self.requests_in_progress = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        prepare = getattr(self.discovery.source, "prepare", None) if self.discovery is not None else None
        if prepare is not None:
            prepare()  # credentials: a one-line error now, before anything opens, not a warning every interval
        if self.shared_state is not None:
            await self.shared_state.start()  # a refused password: a one-line error now; unreachable: fallback
        if self.allowed_media_hosts:  # remote media is fetched here, never by an engine
            # connect only to the addresses the policy checked (no re-resolution in between)
            connector = (
                aiohttp.TCPConnector(resolver=CheckedResolver(self.media_addresses), use_dns_cache=False)
                if not self.media_addresses.allow_internal
                else None
            )
            self.media_session = aiohttp.ClientSession(auto_decompress=True, connector=connector)
            self.preflight.fetcher = RemoteFetcher(self.media_session, self.config.media_fetch_timeout_s)
        self.upstream = ClientPool(self.config.connect_timeout_s)
        if self.preflight.pool is not None:
            self.preflight.pool.start()
        load_image_readers()  # before the first client: never ~0.1 s of imports on the loop at the first image
        self.forwarder = Forwarder(
            self.pool,
            self.policy,
            self.upstream,
            self.watchdog,
            max_attempts=self.config.max_attempts,
            retry_budget=RetryBudget(self.config.retry_budget_ratio, self.config.retry_budget_min_per_s),
            idle_chunk_timeout_s=self.config.idle_chunk_timeout_s,
            first_token_timeout_s=self.config.first_token_timeout_s,
            upstream_auth=self.config.replica_api_key,
            on_retry=lambda replica, reason: self.metrics.retries.labels(replica.name, reason).inc(),
        )
        if self.discovery is not None:
            await self.discovery.poll()  # the source's replicas are health-checked with the static ones
        await self.pool.start()
        if self.discovery is not None:
            self.discovery.start()
        self.watchdog.start()
        healthy = sum(r.healthy for r in self.pool.replicas)
        log.info(
            "gateway routing to %d replica(s) (%d healthy) with policy %s", len(self.pool.replicas), healthy, self.policy.name
        )

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests (503, /health 503) and wait for those in progress to finish."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.requests_in_progress > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self.watchdog.stop()
        await self.pool.stop()
        if self.upstream is not None:
            self.upstream.close()
        if self.media_session is not None:
            await self.media_session.close()
        if self.preflight.pool is not None:
            self.preflight.pool.close()
        if self.shared_state is not None:
            await self.shared_state.close()
        self.audit.close()
        if self.tracing is not None:
            await self.tracing.close()  # the last spans leave on a thread, not on the loop

    # ---- replicas that come and go -------------------------------------------------------------

    def _apply_discovered(self, urls: Sequence[str]) -> None:
        added, removed = self.pool.set_discovered(urls)
        if added:
            self.metrics.replica_changes.labels("added").inc(len(added))
        if removed:
            self.metrics.replica_changes.labels("removed").inc(len(removed))

    def _forget_replica(self, replica: Replica) -> None:
        """A removed replica drained: the policy and the metrics drop what they kept about it."""
        self.policy.forget(replica)
        self.metrics.forget_replica(replica.name)

    # ---- state for /metrics and /health --------------------------------------------------------

    def _outstanding_tokens(self) -> dict[int, int] | None:
        policy = self.policy.inner if isinstance(self.policy, SessionAffinity) else self.policy
        return policy.outstanding if isinstance(policy, LeastOutstandingTokens) else None

    def _snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        outstanding = self._outstanding_tokens()
        return {
            "replicas": {
                r.name: {
                    "in_flight": r.in_flight,
                    "routable": r.routable(now),
                    "outstanding_tokens": None if outstanding is None else outstanding.get(r.index, 0),
                }
                for r in (*self.pool.replicas, *self.pool.draining)
            },
            "replica_states": {
                "routable": sum(r.routable(now) for r in self.pool.replicas),
                "not_ready": sum(not r.healthy for r in self.pool.replicas),
                "draining": len(self.pool.draining),
            },
            "queued": {p: self.admission.queued(p) for p in PRIORITIES},
            "ejected": self.pool.ejected_count(),
            "panic": self.pool.in_panic(),
            "clients": self.client_stats,
            "state_available": None if self.shared_state is None else self.shared_state.available,
        }

    # ---- handlers ------------------------------------------------------------------------------

    async def dispatch(self, request: Request) -> Answer:
        """Every request: its route from the raw target (routes.py), then that kind's handler. A
        Refusal (a bad path, key or admin body) is answered here; engine work answers its own."""
        try:
            route = request.route = resolve(request.method, request.target)
            request.path = route.path
            kind = route.kind
            if kind is RouteKind.ENGINE_WORK:
                return await self.handle_engine_work(request)
            if kind is RouteKind.MODELS:
                return await self.handle_models(request)
            if kind is RouteKind.ENGINE_INFO:
                return await self.handle_engine_info(request)
            if kind is RouteKind.ADMIN:
                return await (handle_engine_metrics if route.path == ENGINE_METRICS_PATH else handle_adapter_admin)(self, request)
            return await (self.handle_health(request) if route.path == "/health" else self.handle_metrics(request))
        except Refusal as refused:
            return refused.answer()

    async def handle_health(self, request: Request) -> Response:
        ok = bool(self.pool.candidates(None)) and not self.draining  # panic routing counts: ejection alone never fails /health
        status = "panic" if ok and self.pool.in_panic() else "ok"
        payload: dict[str, Any] = {
            "status": status if ok else ("draining" if self.draining else "no healthy replica"),
            "policy": self.policy.name,
            "replicas": [r.describe() for r in (*self.pool.replicas, *self.pool.draining)],
        }
        if self.shared_state is not None:  # said, not acted on: rate limits are not the replicas' health
            payload["state"] = self.shared_state.describe()
        return Response.json(payload, status=200 if ok else 503)

    async def handle_metrics(self, request: Request) -> Response:
        return Response(200, self.metrics.render(), {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def handle_models(self, request: Request) -> Response:
        tenant = self.admission.tenant_for(request.headers)
        models = self.adapters.visible(tenant, self.pool.known_models())
        if not models and not self.pool.any_healthy():
            return error_response(*_NO_HEALTHY_REPLICA)
        return Response.json({"object": "list", "data": list(models.values())})

    async def handle_engine_work(self, request: Request) -> Answer:
        """Every ENGINE_WORK route (generation, pooling, tokenizer): admission, media policy, forwarding."""
        route: Route = request.route
        request_log = RequestLog(
            # the gateway's own id, never the client's (request_info.client_request_id says why); not
            # os.urandom: a system call per request; the module's generator is reseeded in forked workers
            request_id="%032x" % random.getrandbits(128),
            path=route.path,
            received_at=time.time(),
            received_mono=time.monotonic(),
        )
        if self.tracing is not None:
            request_log.trace = self.tracing.begin(request.method, route.path, request.headers)
        self.requests_in_progress += 1
        held = _Held()
        try:
            if self.draining:
                request_log.status = "503"
                return error_response(*_DRAINING, retry_after_s=1, request_id=request_log.request_id)
            try:
                body, routed = await self._admit(request, request_log, held)
            except Refusal as rejected:
                request_log.status, request_log.error = str(rejected.status), rejected.message
                if rejected.status == 429 or rejected.code == "state_unavailable":
                    self.metrics.shed.labels(request_log.tenant, rejected.reason).inc()
                return rejected.answer(request_log.request_id, request_log.client_request_id)
            assert self.forwarder is not None
            return await self.forwarder.forward(request, body, routed, request_log)
        except asyncio.CancelledError:
            request_log.status = "abandoned"
            raise
        except Exception as err:  # a bug must cost one request, never the gateway
            log.exception("request %s failed inside the gateway", request_log.request_id)
            request_log.status, request_log.error = "500", f"{type(err).__name__}: {err}"
            return error_response(
                500, "internal gateway error; see the gateway log", "internal_error", request_id=request_log.request_id
            )
        finally:
            self.requests_in_progress -= 1
            self._release(held, request_log)
            self._finish(route, request_log, held.payload)

    async def _admit(self, request: Request, request_log: RequestLog, held: _Held) -> tuple[bytes, RoutedRequest]:
        """The checks before a request may go to a replica, in order: its id header, its key, its
        body, its media, its model, its output limits, its tenant's rate, a slot in flight. What it
        takes (an adapter, a charge, a slot) is noted in `held` as it is taken; a refusal raises
        a Refusal. Returns the body to forward and the router's view of the request."""
        route: Route = request.route
        request_log.client_request_id = client_request_id(request.headers)  # BadRequestHeader: 400
        tenant = held.tenant = self.admission.tenant_for(request.headers)
        request_log.tenant = tenant.name
        body = request.body  # whole, within --max-body-bytes (the server refused a larger one)
        payload = held.payload = self._parse_json(body)
        images = await self._check_media(body, payload, tenant, route)
        if images.images:
            request_log.images = [image.audit() for image in images.images]
        if images.changed:
            body = json.dumps(payload, separators=(",", ":")).encode()
        model = payload.get("model")
        if model is not None and not isinstance(model, str):
            raise AdmissionRejected(400, "'model' must be a string naming a served model (see GET /v1/models)", "invalid_model")
        request_log.model = model
        request_log.adapter = self.adapters.adapter_of(model)
        held.adapter = self.adapters.check(tenant, model)  # 404 unknown, 403 not this key's
        if route.generates:
            check_output_limits(payload)
        routed = held.routed = describe_request(
            payload,
            request_id=request_log.request_id,
            estimator=self.estimator,
            prefix_block_chars=self.config.prefix_block_chars if self.policy.uses_prefix_hashes else None,
            generates=route.generates,
            streams=route.streams,
            image_digests=images.digests or None,
            image_tokens=images.image_tokens if images.images else None,
        )
        routed.tenant, routed.adapter = tenant.name, request_log.adapter
        routed.session_id = session_key(request.headers.get("X-Session-ID"))
        routed.priority = self.admission.priority_for(tenant, request.headers.get("X-Priority"))
        request_log.model, request_log.stream, request_log.priority = routed.model, routed.stream, routed.priority
        # a budget settles, and the audit log records, the relay's count of events, not of pieces (relay.py)
        counted = tenant.token_bucket is not None or self.audit.enabled
        routed.counts_events = routed.stream and counted and not asks_for_usage(payload)
        if tenant.rate_limited:
            context = context_tokens(self.pool.known_models().get(routed.model)) if tenant.token_bucket and routed.model else None
            held.charged = await self.admission.check_rate(
                tenant, admissible_tokens(routed.prompt_tokens, routed.expected_output_tokens, choices_of(payload), context)
            )
        if not self.admission.try_acquire_slot():
            if request_log.trace is not None:
                request_log.trace.queued(routed.priority)
            await self.admission.acquire_slot(routed.priority)
        held.slot = True
        if request_log.trace is not None:
            request_log.trace.admitted(tenant.name, routed.priority)
        return body, routed

    def _release(self, held: _Held, request_log: RequestLog) -> None:
        """Give back what admission took: the adapter's count, the slot, and the charge, settled to the use."""
        if held.adapter is not None:
            self.adapters.release(held.adapter)
        if held.slot:
            self.admission.release_slot()
            if held.tenant is not None and held.charged is not None and held.routed is not None:
                self.admission.settle_tokens(
                    held.tenant,
                    held.charged,
                    settled_tokens(
                        request_log.status, request_log.prompt_tokens, request_log.completion_tokens, held.routed.prompt_tokens
                    ),
                )

    async def _check_media(self, body: bytes, payload: dict[str, Any], tenant: Tenant, route: Route) -> PreflightResult:
        """The media policy (allowed hosts, their addresses) and the image preflight; a refusal is a 400."""
        if not may_hold_media(body):  # text only: nothing to walk for (the processor-kwargs rule still holds)
            try:
                self.preflight.check_client_kwargs(payload)
            except ImageRefused as refused:
                raise self._image_refused(refused) from None
            return TEXT_ONLY
        try:
            remote_hosts = check_media(payload, self.allowed_media_hosts)
            if remote_hosts:  # a listed name may still resolve inside (media/addresses.py)
                await self.media_addresses.check_hosts(remote_hosts)
        except MediaRefused as refused:
            raise AdmissionRejected(400, refused.message, "media_url_not_allowed") from None
        return await self._preflight(payload, tenant, route)

    async def _preflight(self, payload: dict[str, Any], tenant: Tenant, route: Route) -> PreflightResult:
        """The image preflight, counted in the gateway's metrics; a refusal becomes a 400."""
        started = time.perf_counter()
        try:
            result = await self.preflight.run(
                payload, self.image_limits.tightened(*tenant.image_limits), takes_processor_kwargs=route.generates
            )
        except ImageRefused as refused:
            raise self._image_refused(refused) from None
        if result.images:
            self.metrics.image_preflight.observe(time.perf_counter() - started)
            for image in result.images:
                self.metrics.images.labels(image.source).inc()
                if (image.sent_width, image.sent_height) != (image.width, image.height):
                    self.metrics.images.labels("downscaled").inc()
        return result

    def _image_refused(self, refused: ImageRefused) -> AdmissionRejected:
        """A preflight refusal, counted by its code, as the 400 the client gets."""
        self.metrics.images.labels(refused.code).inc()
        return AdmissionRejected(refused.status, refused.message, refused.code, retry_after_s=refused.retry_after_s)

    def _parse_json(self, body: bytes) -> dict[str, Any]:
        """The body as a JSON object, within the depth and item limits; anything else is a 400."""
        check_json_shape(body, max_depth=self.config.max_json_depth, max_items=self.config.max_json_items)
        try:
            payload = json.loads(body)
        except ValueError as err:
            raise AdmissionRejected(
                400,
                f"request body is not valid JSON ({err.msg} at char {err.pos})"
                if isinstance(err, json.JSONDecodeError)
                else "request body is not valid JSON",
                "invalid_json",
            ) from None
        if not isinstance(payload, dict):
            raise AdmissionRejected(400, "request body must be a JSON object", "invalid_json")
        return payload

    def _finish(self, route: Route, request_log: RequestLog, payload: dict[str, Any] | None) -> None:
        request_log.finished_mono = time.monotonic()
        self.metrics.count_request(request_log.status, request_log.tenant, request_log.replica)
        if request_log.first_byte_mono is not None and request_log.status == "200":
            received = request_log.received_mono
            self.metrics.observe_latency(
                request_log.replica,
                route.path,
                request_log.first_byte_mono - received if route.generates else None,
                request_log.finished_mono - received,
            )
        if request_log.adapter is not None:
            self.adapters.observe(
                request_log.adapter,
                request_log.status,
                None if request_log.first_byte_mono is None else request_log.first_byte_mono - request_log.received_mono,
            )
        if request_log.trace is not None:
            request_log.trace.finish(request_log)
        if self.audit.enabled:
            content = (
                None
                if payload is None
                else next((payload[key] for key in ("messages", "prompt", "input") if key in payload), None)
            )
            self.audit.write(request_log.to_record(), content)

    async def handle_engine_info(self, request: Request) -> Response:
        """A cheap ENGINE_INFO GET (/version): forwarded under its table path to one healthy replica."""
        route: Route = request.route
        if self.draining:
            return error_response(*_DRAINING, retry_after_s=1)
        self.admission.tenant_for(request.headers)
        candidates = self.pool.candidates(None)
        if not candidates:
            return error_response(*_NO_HEALTHY_REPLICA, retry_after_s=1)
        replica: Replica = self._engine_info_rotation.choose(None, candidates)  # type: ignore[arg-type]
        assert self.upstream is not None
        try:
            answer, body = await fetch_whole(
                self.upstream, "GET", replica.url + route.path, self.replica_headers, b"", self.pool.probe_timeout_s
            )
        except (OSError, TimeoutError) as err:
            self.pool.record_failure(replica)
            return error_response(502, f"replica {replica.name} failed: {type(err).__name__}", "upstream_error")
        return Response(answer.status, body, {"Content-Type": answer.headers.get("content-type", "application/json")})
