"""Who may send what, and how fast: API keys → tenants, token buckets, a priority queue.

No keys file means an open gateway (every request is tenant `anonymous`). With one, every
request must carry a listed key (`Authorization: Bearer KEY` or `X-API-Key: KEY`).

Rate limits are per tenant: requests per second and tokens per minute (estimated prompt +
requested output at admission, corrected with the real usage afterwards). They are kept in
this process, or, with `--state redis://...`, in Redis, shared by every gateway process and
instance (shared_state.py decides, and says when to fall back to this process's buckets).
In-flight caps and priority queues always stay per process. When the gateway
caps requests in flight (`max_in_flight`), the rest wait in one bounded queue per priority
class; interactive waiters always go before batch ones. A full queue answers 429 with
Retry-After at once — shedding keeps latency for admitted requests instead of collapsing it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vlmserve.errors import UserError
from vlmserve.gateway.redis_buckets import BucketLimits
from vlmserve.gateway.shared_state import SharedState, StateUnavailable
from vlmserve.spec import describe_validation_error, load_yaml_file

PRIORITIES = ("interactive", "batch")
ANONYMOUS = "anonymous"


class TenantSpec(BaseModel):
    """One tenant in the keys file."""

    model_config = ConfigDict(extra="forbid")

    name: str
    keys: list[str] = Field(min_length=1)
    requests_per_s: float | None = Field(None, gt=0)
    tokens_per_min: float | None = Field(None, gt=0)
    priority: Literal["interactive", "batch"] = "interactive"
    burst_requests: float | None = Field(None, gt=0, description="bucket size; default one second of requests_per_s")
    max_image_bytes: int | None = Field(None, ge=1, description="stricter than the gateway's --max-image-bytes")
    max_image_pixels: int | None = Field(None, ge=1, description="stricter than the gateway's --max-image-pixels")
    max_images_per_request: int | None = Field(None, ge=1, description="stricter than --max-images-per-request")


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[TenantSpec] = Field(min_length=1)


def load_keys_file(path: str | Path) -> list[TenantSpec]:
    """Read and validate a keys file; problems become one line that names the field."""
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: a keys file is a YAML mapping with a 'tenants:' list (name, keys, limits)")
    try:
        tenants = KeysFile.model_validate(data).tenants
    except ValidationError as err:
        raise UserError(describe_validation_error(err, str(path))) from None
    seen: dict[str, str] = {}
    names: set[str] = set()
    for tenant in tenants:
        if tenant.name in names:
            raise UserError(f"{path}: tenant {tenant.name!r} is listed twice; merge the entries")
        names.add(tenant.name)
        for key in tenant.keys:
            if key in seen:
                raise UserError(f"{path}: a key is listed for both {seen[key]!r} and {tenant.name!r}; give each tenant its own keys")
            seen[key] = tenant.name
    return tenants


class TokenBucket:
    """Classic token bucket; `take` either takes `amount` now or says how long until it could."""

    def __init__(self, rate_per_s: float, capacity: float) -> None:
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self.tokens = capacity
        self.updated_at = time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated_at) * self.rate_per_s)
        self.updated_at = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until `amount` is available (0 if it is now). Takes nothing."""
        self._refill(now)
        amount = min(amount, self.capacity)
        return 0.0 if self.tokens >= amount else (amount - self.tokens) / self.rate_per_s

    def take(self, amount: float) -> None:
        self.tokens -= min(amount, self.capacity)

    def settle(self, charged: float, actual: float) -> None:
        """Correct an estimate afterwards (may leave the bucket in debt, never below -capacity)."""
        self.tokens = max(-self.capacity, min(self.capacity, self.tokens + charged - actual))


@dataclass
class Tenant:
    name: str
    priority: str = "interactive"
    request_bucket: TokenBucket | None = None
    token_bucket: TokenBucket | None = None
    image_limits: tuple[int | None, int | None, int | None] = (None, None, None)
    """(max_image_bytes, max_image_pixels, max_images_per_request) for this tenant; None: the gateway's."""

    @classmethod
    def from_spec(cls, spec: TenantSpec) -> Tenant:
        request_bucket = token_bucket = None
        if spec.requests_per_s:
            request_bucket = TokenBucket(spec.requests_per_s, spec.burst_requests or max(1.0, spec.requests_per_s))
        if spec.tokens_per_min:
            token_bucket = TokenBucket(spec.tokens_per_min / 60.0, spec.tokens_per_min)
        return cls(name=spec.name, priority=spec.priority, request_bucket=request_bucket, token_bucket=token_bucket,
                   image_limits=(spec.max_image_bytes, spec.max_image_pixels, spec.max_images_per_request))

    @property
    def rate_limited(self) -> bool:
        """Whether check_rate has anything to check (most deployments' anonymous tenant has not)."""
        return self.request_bucket is not None or self.token_bucket is not None

    @property
    def limits(self) -> BucketLimits:
        """The same limits as the local buckets, for the shared (Redis) ones."""
        requests, tokens = self.request_bucket, self.token_bucket
        return BucketLimits(
            requests_per_s=requests.rate_per_s if requests else 0.0, request_capacity=requests.capacity if requests else 0.0,
            tokens_per_s=tokens.rate_per_s if tokens else 0.0, token_capacity=tokens.capacity if tokens else 0.0,
        )


class AdmissionRejected(Exception):
    """Carries the HTTP status, OpenAI error type/code and Retry-After for the response."""

    def __init__(self, status: int, message: str, code: str, retry_after_s: float | None = None,
                 reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.reason = reason or code


@dataclass
class _Waiter:
    future: asyncio.Future = field(repr=False)


class Admission:
    """Authentication, rate limits and the priority queue for one gateway."""

    def __init__(
        self,
        tenants: list[TenantSpec] | None = None,
        *,
        max_in_flight: int = 0,
        queue_limits: dict[str, int] | None = None,
        queue_timeout_s: float = 60.0,
        shared: SharedState | None = None,
    ) -> None:
        self.open = not tenants
        self.shared = shared
        self._by_key: dict[str, Tenant] = {}
        self.tenants: dict[str, Tenant] = {}
        for spec in tenants or []:
            tenant = Tenant.from_spec(spec)
            self.tenants[tenant.name] = tenant
            for key in spec.keys:
                self._by_key[key] = tenant
        self._anonymous = Tenant(ANONYMOUS)
        self.max_in_flight = max_in_flight
        self.queue_limits = {"interactive": 1024, "batch": 4096, **(queue_limits or {})}
        self.queue_timeout_s = queue_timeout_s
        self.in_flight = 0
        self._queues: dict[str, deque[_Waiter]] = {p: deque() for p in PRIORITIES}

    # ---- who ----------------------------------------------------------------------------------

    def tenant_for(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant a request's headers authenticate (Authorization or X-API-Key); with no keys
        configured, the anonymous tenant, without reading any header."""
        if self.open:
            return self._anonymous
        return self.authenticate(headers.get("Authorization"), headers.get("X-API-Key"))

    def authenticate(self, authorization: str | None, api_key_header: str | None) -> Tenant:
        if self.open:
            return self._anonymous
        key = api_key_header
        if authorization:
            scheme, _, value = authorization.partition(" ")
            key = value.strip() if scheme.lower() == "bearer" else authorization.strip()
        if not key:
            raise AdmissionRejected(401, "missing API key: send 'Authorization: Bearer <key>'", "missing_api_key")
        tenant = self._by_key.get(key)
        if tenant is None:
            raise AdmissionRejected(401, "invalid API key: check the key or ask the operator for one", "invalid_api_key")
        return tenant

    def priority_for(self, tenant: Tenant, header: str | None) -> str:
        """A request may lower its own priority (X-Priority: batch) but not raise it above its tenant's."""
        if header:
            wanted = header.strip().lower()
            if wanted not in PRIORITIES:
                raise AdmissionRejected(400, f"X-Priority must be one of {', '.join(PRIORITIES)}", "invalid_priority")
            if wanted == "batch" or tenant.priority == "interactive":
                return wanted
        return tenant.priority

    # ---- how fast -----------------------------------------------------------------------------

    async def check_rate(self, tenant: Tenant, estimated_tokens: int) -> str | None:
        """Take from the tenant's buckets, or raise 429 with the wait until it would fit.

        Returns where the request was charged ("shared", "local", or None when the tenant has no
        limit); `settle_tokens` needs it. With shared state unavailable and mode closed, 503."""
        if not tenant.rate_limited:
            return None
        if self.shared is not None:
            try:
                wait = await self.shared.admit(tenant.name, tenant.limits, estimated_tokens)
            except StateUnavailable as unavailable:
                raise AdmissionRejected(503, str(unavailable), "state_unavailable", retry_after_s=1.0,
                                        reason="state_unavailable") from None
            if wait is not None:
                if wait > 0:
                    raise self._rate_limited(tenant, wait)
                return "shared"
        now = time.monotonic()
        waits = []
        if tenant.request_bucket is not None:
            waits.append(tenant.request_bucket.wait_s(1, now))
        if tenant.token_bucket is not None:
            waits.append(tenant.token_bucket.wait_s(estimated_tokens, now))
        wait = max(waits, default=0.0)
        if wait > 0:
            raise self._rate_limited(tenant, wait)
        if tenant.request_bucket is not None:
            tenant.request_bucket.take(1)
        if tenant.token_bucket is not None:
            tenant.token_bucket.take(estimated_tokens)
        return "local"

    @staticmethod
    def _rate_limited(tenant: Tenant, wait: float) -> AdmissionRejected:
        return AdmissionRejected(
            429,
            f"rate limit exceeded for tenant {tenant.name!r}: retry after {math.ceil(wait)} s or ask for a higher limit",
            "rate_limit_exceeded",
            retry_after_s=wait,
            reason="rate_limited",
        )

    def settle_tokens(self, tenant: Tenant, estimated_tokens: int, actual_tokens: int | None,
                      charged: str | None = "local") -> None:
        """Correct the token estimate with the usage the engine reported, where it was charged."""
        if tenant.token_bucket is None or actual_tokens is None or charged is None:
            return
        if charged == "shared" and self.shared is not None:
            self.shared.settle(tenant.name, tenant.limits, estimated_tokens - actual_tokens)
        else:
            tenant.token_bucket.settle(estimated_tokens, actual_tokens)

    # ---- how many at once -----------------------------------------------------------------------

    def queued(self, priority: str) -> int:
        return len(self._queues[priority])

    def try_acquire_slot(self) -> bool:
        """Take a slot if one is free and nobody waits: the common case, with no coroutine to run."""
        if self.max_in_flight <= 0 or (self.in_flight < self.max_in_flight and not any(self._queues.values())):
            self.in_flight += 1
            return True
        return False

    async def acquire_slot(self, priority: str) -> None:
        """Return when the request may go to an engine; raise 429 if its queue is full or too slow."""
        if self.try_acquire_slot():
            return
        queue = self._queues[priority]
        if len(queue) >= self.queue_limits[priority]:
            raise AdmissionRejected(
                429, f"gateway is at capacity and the {priority} queue is full: retry later", "queue_full",
                retry_after_s=1.0, reason="queue_full",
            )
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.queue_timeout_s)
        except asyncio.TimeoutError:
            if not self._forget(queue, waiter) and waiter.future.done():
                return  # the slot arrived at the same moment as the timeout: use it
            raise AdmissionRejected(
                429, f"waited {self.queue_timeout_s:.0f} s in the {priority} queue: the gateway is overloaded, retry later",
                "queue_timeout", retry_after_s=1.0, reason="queue_timeout",
            ) from None
        except asyncio.CancelledError:
            if not self._forget(queue, waiter) and waiter.future.done():
                self.release_slot()  # the slot was handed to us just as the client left
            raise

    def _forget(self, queue: deque[_Waiter], waiter: _Waiter) -> bool:
        try:
            queue.remove(waiter)
            return True
        except ValueError:
            return False

    def release_slot(self) -> None:
        """Hand the slot to the next waiter (interactive first) or give it back."""
        if self.max_in_flight > 0:
            for priority in PRIORITIES:
                queue = self._queues[priority]
                while queue:
                    waiter = queue.popleft()
                    if not waiter.future.done():
                        waiter.future.set_result(None)
                        return  # the slot passes on; in_flight is unchanged
        self.in_flight -= 1
