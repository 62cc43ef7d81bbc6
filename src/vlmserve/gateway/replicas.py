"""The gateway's picture of its replicas: alive or not, what they serve, how loaded they are.

Two sources of truth are combined. Active checks (GET /health every `health_interval_s`)
notice a replica that is down even when no traffic goes to it; the circuit breaker notices one
that fails real requests. Engine load (/metrics) is polled only when the policy uses it.
Probes go through the gateway's own keep-alive client (http1/client.py), the one its traffic uses:
through aiohttp's client a probe cost about 0.8 ms of CPU, most of an idle gateway's CPU and a
cost vllm-router (which probes far less often) does not pay.

Passive ejection is bounded, as Envoy's outlier detection is:
- At most floor(max_ejection_fraction × replicas) breakers are open (or probing) at once; a
  replica that reaches its failure threshold beyond that stays in rotation (its breaker keeps
  counting). Unlike Envoy, which ejects at least one host whatever the percentage, the count
  rounds down: with one replica (or two at a fraction below 0.5) nothing is ever ejected,
  since there is nowhere else to send the traffic.
- Panic mode: when no replica that passes its active health check is also un-ejected, every
  replica passing its health check is routed to, ejected or not (Envoy's panic threshold at
  its extreme): an ejection can shrink the pool, never empty it.

Replicas that come and go (`set_discovered`, fed by vlmserve/discovery): the static replicas stay; a
new URL joins unhealthy and is routed to only once its health check passes (checked at once,
not a health interval later); a URL that leaves stops getting new requests and drains — its
requests in flight finish — and once none is left it is forgotten (`on_forget`: the policy and
the metrics drop what they kept about it). Indices are never reused, so state a policy keyed by
a removed replica's index can never attach to a newcomer. The ejection cap follows the set's size.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from vlmserve.gateway.breaker import BreakerState, CircuitBreaker
from vlmserve.gateway.engine_metrics import EngineLoad, parse_engine_load
from vlmserve.http1.client import AnswerTooLarge, CappedBody, ClientPool, ClientResponse
from vlmserve.http1.headers import header_lines
from vlmserve.prometheus_text import MAX_PAGE_BYTES

log = logging.getLogger("vlmserve.gateway")

HEALTH_FAILURES_TO_MARK_DOWN = 2
MODELS_REFRESH_S = 10.0
# A replica that answered real traffic this recently is alive, whatever a slow /health says:
# an engine under heavy load can take seconds to answer /health while it serves fine.
RECENT_SUCCESS_S = 10.0


async def fetch_whole(
    client: ClientPool, method: str, url: str, headers: bytes, body: bytes, timeout_s: float
) -> tuple[ClientResponse, bytes]:
    """One request to a replica and its answer read whole, within `timeout_s` (connecting included) and
    MAX_PAGE_BYTES (its /metrics page is the largest it sends); the connection goes back to the pool.
    Raises TimeoutError, or OSError (the client's ClientError included: a reset, a close, not HTTP,
    AnswerTooLarge)."""
    response: ClientResponse | None = None
    answer = CappedBody(MAX_PAGE_BYTES)
    try:
        async with asyncio.timeout(timeout_s):
            answer.sent = client.send(method, url, headers, body, answer)
            response = await answer.sent.response()
            await response.wait_end()
    except OSError:
        answer.whole()  # AnswerTooLarge, when that is why the read failed
        raise
    finally:
        if response is not None:
            response.release()  # closes it unless the body was read whole (a no-op then)
    return response, answer.whole()


@dataclass(eq=False)
class Replica:
    """One engine behind the gateway and the gateway's own bookkeeping about it."""

    index: int
    url: str
    breaker: CircuitBreaker
    healthy: bool = False
    health_failures: int = 0
    models: list[dict] = field(default_factory=list)
    models_checked_at: float = 0.0
    load: EngineLoad | None = None  # the last scrape of its engine's /metrics (when the policy reads them)
    in_flight: int = 0  # requests dispatched and not yet finished (the gateway's own count)
    last_success_at: float = -math.inf  # monotonic time of the last request it answered well
    dispatched_total: int = 0
    discovered: bool = False  # from --discover (may leave); False: a static --replica (stays)
    draining: bool = False  # removed from the source: no new requests, in-flight ones finish
    # model_ids is asked for on every request: the set is rebuilt only when `models` is replaced
    _ids_of: list[dict] | None = field(default=None, init=False, repr=False)
    _ids: set[str] = field(default_factory=set, init=False, repr=False)

    @functools.cached_property
    def name(self) -> str:
        """host:port, used as the `replica` label in metrics and the audit log (a replica's URL never changes)."""
        return urlsplit(self.url).netloc or self.url

    @property
    def model_ids(self) -> set[str]:
        if self._ids_of is not self.models:
            self._ids = {str(m["id"]) for m in self.models if isinstance(m, dict) and "id" in m}
            self._ids_of = self.models
        return self._ids

    def record_success(self) -> None:
        self.last_success_at = time.monotonic()
        self.breaker.record_success()

    def routable(self, now: float) -> bool:
        return self.healthy and self.breaker.available(now)

    def serves(self, model: str | None) -> bool:
        """Unknown model lists (not fetched yet) count as 'maybe': the engine will answer."""
        return model is None or not self.models or model in self.model_ids

    def describe(self) -> dict:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "breaker": self.breaker.state.value,
            "in_flight": self.in_flight,
            "models": sorted(self.model_ids),
            "discovered": self.discovered,
            "draining": self.draining,
        }


class ReplicaPool:
    """Owns the replicas and the background tasks that keep their state current."""

    def __init__(
        self,
        urls: list[str],
        *,
        health_interval_s: float = 1.0,
        metrics_interval_s: float | None = None,
        breaker_failures: int = 3,
        breaker_open_s: float = 5.0,
        breaker_open_max_s: float = 60.0,
        max_ejection_fraction: float = 0.5,
        upstream_headers: dict[str, str] | None = None,
        on_load_update: Callable[[Replica, EngineLoad], None] | None = None,
        on_ejection: Callable[[Replica], None] | None = None,
        on_forget: Callable[[Replica], None] | None = None,
    ) -> None:
        self._breaker_settings = (breaker_failures, breaker_open_s, breaker_open_max_s)
        self._next_index = 0
        self.replicas: list[Replica] = [self._new_replica(url) for url in urls]
        self.draining: list[Replica] = []  # removed, with requests still in flight
        self.max_ejection_fraction = max_ejection_fraction
        self.max_ejections = 0
        self._update_ejection_cap()
        self.on_forget = on_forget
        self._client: ClientPool | None = None  # the probes' connections (start to stop)
        self.health_interval_s = health_interval_s
        # how long a probe may take, connecting included: a busy replica answers late, not never
        self.probe_timeout_s = max(3.0, 3 * health_interval_s)
        self.metrics_interval_s = metrics_interval_s
        self._probe_headers = header_lines((upstream_headers or {}).items())
        self.on_load_update = on_load_update
        self.on_ejection = on_ejection
        self._tasks: list[asyncio.Task] = []
        self._one_off: set[asyncio.Task] = set()

    def _new_replica(self, url: str, discovered: bool = False) -> Replica:
        replica = Replica(
            index=self._next_index, url=url.rstrip("/"), breaker=CircuitBreaker(*self._breaker_settings), discovered=discovered
        )
        self._next_index += 1
        return replica

    def _update_ejection_cap(self) -> None:
        self.max_ejections = math.floor(self.max_ejection_fraction * len(self.replicas) + 1e-9)

    # ---- replicas that come and go -----------------------------------------------------------

    def set_discovered(self, urls: Iterable[str]) -> tuple[list[Replica], list[Replica]]:
        """Make the discovered replicas exactly `urls` (the module docstring's rules); returns (added, removed).
        A URL that returns while its replica drains is taken back as it is (same index, breaker and policy state)."""
        static = {r.url for r in self.replicas if not r.discovered}
        wanted = {url.rstrip("/") for url in urls} - static
        current = {r.url: r for r in self.replicas if r.discovered}
        removed = [current[url] for url in sorted(current.keys() - wanted)]
        added: list[Replica] = []
        for url in sorted(wanted - current.keys()):
            returning = next((r for r in self.draining if r.url == url), None)
            if returning is not None:
                self.draining.remove(returning)
                returning.draining = False
                added.append(returning)
            else:
                added.append(self._new_replica(url, discovered=True))
        for replica in removed:
            replica.draining = True
            self.draining.append(replica)
        self.replicas = [r for r in self.replicas if not r.draining] + added  # a new list: loops iterating the old one are safe
        self._update_ejection_cap()
        for replica in added:
            log.info("replica %s joined (routed to once its health check passes)", replica.url)
            if self._client is not None:
                self._spawn(self._check_health(replica), f"gateway-ready-{replica.index}")
        for replica in removed:
            log.info("replica %s left: draining %d request(s) in flight", replica.url, replica.in_flight)
        self.forget_drained()
        return added, removed

    def forget_drained(self) -> list[Replica]:
        """Drop draining replicas with nothing left in flight; returns them."""
        done = [r for r in self.draining if r.in_flight <= 0]
        if done:
            self.draining = [r for r in self.draining if r.in_flight > 0]
            for replica in done:
                log.info("replica %s drained", replica.url)
                if self.on_forget is not None:
                    try:
                        self.on_forget(replica)
                    except Exception:  # bookkeeping must never stop the health loop that calls this
                        log.exception("forgetting replica %s failed", replica.url)
        return done

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._one_off.add(task)
        task.add_done_callback(self._one_off.discard)

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Check every replica once (so /health is meaningful at once), then keep checking."""
        # connecting may take the probe's whole time: the probe's own timeout, not the client's, ends it
        self._client = ClientPool(connect_timeout_s=self.probe_timeout_s + 1)
        await asyncio.gather(*(self._check_health(r) for r in self.replicas))
        self._tasks.append(asyncio.create_task(self._health_loop(), name="gateway-health"))
        if self.metrics_interval_s:
            await asyncio.gather(*(self._poll_metrics(r) for r in self.replicas))
            self._tasks.append(asyncio.create_task(self._metrics_loop(), name="gateway-metrics"))

    async def stop(self) -> None:
        for task in [*self._tasks, *self._one_off]:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: S110 - stopping: each loop logged its own failures
                pass
        self._tasks.clear()
        self._one_off.clear()
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---- queries used on the request path --------------------------------------------------

    def candidates(self, model: str | None, exclude: set[int] | frozenset[int] = frozenset()) -> list[Replica]:
        """Replicas that may take a request for `model` now, less `exclude` (tried already).

        Healthy and not ejected; in panic mode (no such replica) every healthy one."""
        now = time.monotonic()
        healthy: list[Replica] = []
        routable: list[Replica] = []
        for replica in self.replicas:  # one pass: asked on every request
            if replica.healthy and replica.serves(model):
                healthy.append(replica)
                if replica.breaker.available(now):
                    routable.append(replica)
        chosen = routable or healthy
        return [r for r in chosen if r.index not in exclude] if exclude else chosen

    def ejected_count(self) -> int:
        """Replicas whose breaker is open or probing (passively ejected)."""
        return sum(r.breaker.state is not BreakerState.CLOSED for r in self.replicas)

    def in_panic(self) -> bool:
        """Some replica passes its health check, but every one that does is ejected."""
        now = time.monotonic()
        healthy = [r for r in self.replicas if r.healthy]
        return bool(healthy) and not any(r.breaker.available(now) for r in healthy)

    def known_models(self) -> dict[str, dict]:
        """Union of every healthy replica's /v1/models entries, keyed by model id."""
        union: dict[str, dict] = {}
        for replica in self.replicas:
            if not replica.healthy:
                continue
            for entry in replica.models:
                if isinstance(entry, dict) and "id" in entry:
                    union.setdefault(str(entry["id"]), entry)
        return union

    def lists_model(self, model: str) -> bool:
        """Whether a healthy replica lists `model`, or none has listed any model yet (then the
        engine decides). Asked per request: no union of the lists is built (known_models)."""
        lists = [replica.model_ids for replica in self.replicas if replica.healthy and replica.models]
        return any(model in ids for ids in lists) or not any(lists)

    def any_healthy(self) -> bool:
        return any(r.healthy for r in self.replicas)

    # ---- passive outcomes reported by the proxy --------------------------------------------

    def record_failure(self, replica: Replica) -> None:
        """A failure that is the replica's fault; ejects it unless the ejection cap is reached."""
        was_open = replica.breaker.state is BreakerState.OPEN
        may_open = replica.breaker.state is not BreakerState.CLOSED or self.ejected_count() < self.max_ejections
        if replica.breaker.record_failure(time.monotonic(), may_open) and not was_open:
            log.warning("replica %s ejected after repeated failures", replica.url)
            if self.on_ejection is not None:
                self.on_ejection(replica)

    # ---- background checks -----------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            self.forget_drained()
            await asyncio.gather(*(self._check_health(r) for r in self.replicas))

    async def _metrics_loop(self) -> None:
        assert self.metrics_interval_s
        while True:
            await asyncio.sleep(self.metrics_interval_s)
            await asyncio.gather(*(self._poll_metrics(r) for r in self.replicas if r.healthy))

    async def _probe_status(self, replica: Replica, path: str) -> tuple[bytes | None, str]:
        """GET `path` on the replica (never raises): the body when it answers 200, else None, and
        why: 'ok', or 'refused' (nothing listens), 'timeout', 'over N bytes' or 'error'."""
        assert self._client is not None
        try:
            response, body = await fetch_whole(
                self._client, "GET", replica.url + path, self._probe_headers, b"", self.probe_timeout_s
            )
        except TimeoutError:
            return None, "timeout"
        except ConnectionRefusedError:
            return None, "refused"
        except OSError as err:  # the client's ClientError included: a reset, a close, not HTTP, too large
            return None, str(err) if isinstance(err, AnswerTooLarge) else "error"
        return (body, "ok") if response.status == 200 else (None, "error")

    async def _check_health(self, replica: Replica) -> None:
        body, why = await self._probe_status(replica, "/health")
        if body is not None:
            if not replica.healthy:
                log.info("replica %s is healthy", replica.url)
            replica.healthy = True
            replica.health_failures = 0
            if not replica.models or time.monotonic() - replica.models_checked_at > MODELS_REFRESH_S:
                await self._refresh_models(replica)
            return
        if why == "timeout" and time.monotonic() - replica.last_success_at < RECENT_SUCCESS_S:
            return  # slow to answer /health but serving traffic: busy, not down
        replica.health_failures += 1
        # A fresh replica that never answered is simply down; a known one gets one grace check.
        if replica.healthy and replica.health_failures >= HEALTH_FAILURES_TO_MARK_DOWN:
            log.warning("replica %s failed %d health checks (%s); no longer routed to", replica.url, replica.health_failures, why)
            replica.healthy = False

    async def _refresh_models(self, replica: Replica) -> None:
        body, _ = await self._probe_status(replica, "/v1/models")
        try:
            payload = json.loads(body) if body is not None else None
        except ValueError:
            return
        data = payload.get("data") if isinstance(payload, dict) else None
        if isinstance(data, list):
            replica.models = [m for m in data if isinstance(m, dict)]
            replica.models_checked_at = time.monotonic()

    async def _poll_metrics(self, replica: Replica) -> None:
        body, _ = await self._probe_status(replica, "/metrics")
        if body is None:
            return
        replica.load = parse_engine_load(body.decode("utf-8", "replace"), time.monotonic())
        if self.on_load_update is not None and not replica.draining:  # a leaver's load would outlive its forget
            self.on_load_update(replica, replica.load)
