"""Who may send what, and how fast: API keys → tenants, token buckets, a priority queue.

No keys file means an open gateway (every request is tenant `anonymous`). With one, every
request must carry a listed key (`Authorization: Bearer KEY` or `X-API-Key: KEY`).

Rate limits are per tenant: requests per second and tokens per minute. A token budget charges
what a request may cost at admission (`admissible_tokens`: the prompt estimate plus its output
limit, capped by the model's context) and settles to what it did cost (`settled_tokens`), never
refunding more than it charged: use beyond the charge is a debt the tenant's next requests wait
out. A request that may cost more than the whole budget is admitted only when the budget is full,
and charged all of it. The buckets are kept in this process (`TokenBucket`), or, with `--state
redis://...`, in Redis by the same rule (redis_buckets.py, shared_state.py, which says when to fall
back here). In-flight caps and priority queues always stay per process. When the gateway
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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vlmserve.errors import UserError
from vlmserve.gateway.openai_errors import Refusal
from vlmserve.gateway.redis_buckets import BucketLimits
from vlmserve.gateway.request_info import OUTPUT_LIMIT_KEYS
from vlmserve.gateway.shared_state import SharedState, StateUnavailable
from vlmserve.spec import ADAPTER_NAME, MAX_SPEC_ADAPTERS, describe_validation_error, load_yaml_file

PRIORITIES = ("interactive", "batch")
ANONYMOUS = "anonymous"


# The sane range of each limit in a keys file (inclusive). Outside it a number is a typo or an
# attack on the buckets' arithmetic (inf and 1e-30 broke the Redis script for every tenant): a
# bucket that refills in under a microsecond or in over ten years is not a limit anyone means.
LIMIT_BOUNDS: dict[str, tuple[float, float]] = {
    "requests_per_s": (1e-6, 1e6),
    "burst_requests": (1.0, 1e9),
    "tokens_per_min": (1.0, 1e12),
}

MAX_OUTPUT_TOKENS = 2**31 - 1
"""The most a request's `max_tokens` (or `n`) may say: engines keep token counts in 32-bit integers.
Anything larger, or not a whole number, is a 400 before any arithmetic (10**309 overflowed a float)."""


class TenantSpec(BaseModel):
    """One tenant in the keys file."""

    model_config = ConfigDict(extra="forbid")

    name: str
    keys: list[str] = Field(min_length=1)
    requests_per_s: float | None = None
    tokens_per_min: float | None = None
    priority: Literal["interactive", "batch"] = "interactive"
    burst_requests: float | None = Field(None, description="bucket size; default one second of requests_per_s")
    max_image_bytes: int | None = Field(None, ge=1, description="stricter than the gateway's --max-image-bytes")
    max_image_pixels: int | None = Field(None, ge=1, description="stricter than the gateway's --max-image-pixels")
    max_images_per_request: int | None = Field(None, ge=1, description="stricter than --max-images-per-request")
    adapters: list[str] | None = Field(
        None, max_length=MAX_SPEC_ADAPTERS, description="LoRA adapters it may use; none listed: any (gateway/adapters.py)"
    )
    base_model: bool = Field(True, description="it may use the base model (false: its adapters only)")
    admin: bool = Field(False, description="it may load and unload LoRA adapters on every replica (adapter_admin.py)")

    @model_validator(mode="after")
    def _adapter_names(self) -> TenantSpec:
        for name in self.adapters or []:
            if not ADAPTER_NAME.fullmatch(name):
                raise ValueError(
                    f"tenant {self.name!r}: adapter name {name[:80]!r} is not allowed; "
                    "use up to 64 letters, digits, '-', '_' or '.'"
                )
        return self

    @model_validator(mode="after")
    def _limits_in_bounds(self) -> TenantSpec:
        """Each limit finite and within LIMIT_BOUNDS, said in one line that names the tenant."""
        for key, (low, high) in LIMIT_BOUNDS.items():
            value = getattr(self, key)
            if value is not None and not low <= value <= high:  # NaN fails both comparisons
                raise ValueError(f"tenant {self.name!r}: {key} is {value!r}; it must be a finite number from {low:g} to {high:g}")
        return self


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
                raise UserError(
                    f"{path}: a key is listed for both {seen[key]!r} and {tenant.name!r}; give each tenant its own keys"
                )
            seen[key] = tenant.name
    return tenants


class TokenBucket:
    """A token bucket that charges whole costs and may go into debt (the rule in the module docstring):
    `wait_s` asks for min(amount, capacity), `take` charges all of `amount`, `settle` gives back."""

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
        self.tokens -= amount

    def settle(self, refund: float) -> None:
        """Give back `refund` (charged less used; negative: a debt for use beyond the charge), up to full."""
        self.tokens = min(self.capacity, self.tokens + refund)


@dataclass
class Tenant:
    name: str
    priority: str = "interactive"
    request_bucket: TokenBucket | None = None
    token_bucket: TokenBucket | None = None
    image_limits: tuple[int | None, int | None, int | None] = (None, None, None)
    """(max_image_bytes, max_image_pixels, max_images_per_request) for this tenant; None: the gateway's."""
    adapters: frozenset[str] | None = None  # the LoRA adapters it may use; None: any
    base_model: bool = True  # it may use the base model
    admin: bool = False  # it may load and unload adapters (adapter_admin.py)

    @classmethod
    def from_spec(cls, spec: TenantSpec) -> Tenant:
        request_bucket = token_bucket = None
        if spec.requests_per_s:
            request_bucket = TokenBucket(spec.requests_per_s, spec.burst_requests or max(1.0, spec.requests_per_s))
        if spec.tokens_per_min:
            token_bucket = TokenBucket(spec.tokens_per_min / 60.0, spec.tokens_per_min)
        return cls(
            name=spec.name,
            priority=spec.priority,
            request_bucket=request_bucket,
            token_bucket=token_bucket,
            image_limits=(spec.max_image_bytes, spec.max_image_pixels, spec.max_images_per_request),
            adapters=None if spec.adapters is None else frozenset(spec.adapters),
            base_model=spec.base_model,
            admin=spec.admin,
        )

    @property
    def rate_limited(self) -> bool:
        """Whether check_rate has anything to check (most deployments' anonymous tenant has not)."""
        return self.request_bucket is not None or self.token_bucket is not None

    @property
    def limits(self) -> BucketLimits:
        """The same limits as the local buckets, for the shared (Redis) ones."""
        requests, tokens = self.request_bucket, self.token_bucket
        return BucketLimits(
            requests_per_s=requests.rate_per_s if requests else 0.0,
            request_capacity=requests.capacity if requests else 0.0,
            tokens_per_s=tokens.rate_per_s if tokens else 0.0,
            token_capacity=tokens.capacity if tokens else 0.0,
        )


@dataclass(frozen=True, slots=True)
class Charge:
    """What admission took from a tenant's token budget, and where: what `settle_tokens` corrects."""

    where: Literal["local", "shared"]
    tokens: int  # the whole admissible cost (0 when the tenant has no token budget)


def check_output_limits(payload: Mapping[str, object]) -> None:
    """A 400 for an output limit (`max_tokens` and its aliases, `n`) that is not a whole number
    from 1 to MAX_OUTPUT_TOKENS, before any budget arithmetic sees it. null means "not given"."""
    for key in (*OUTPUT_LIMIT_KEYS, "n"):
        value = payload.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
            shown = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else "a number that large"
            raise AdmissionRejected(
                400,
                f"'{key}' must be a whole number from 1 to {MAX_OUTPUT_TOKENS}, got {shown[:40]}",
                "invalid_max_tokens" if key != "n" else "invalid_n",
            )


def context_tokens(model_entry: Mapping[str, object] | None) -> int | None:
    """The model's context length from its /v1/models entry (vLLM's `max_model_len`), when it says."""
    value = model_entry.get("max_model_len") if model_entry is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def admissible_tokens(prompt_tokens: int, output_tokens: int, choices: int, context: int | None) -> int:
    """The most a request may cost: its prompt estimate and its output limit (`output_tokens`, all
    `choices` together), each choice's output capped by the model's context where known."""
    if context is not None:
        output_tokens = min(output_tokens, choices * context)
    return prompt_tokens + output_tokens


def asks_for_usage(payload: Mapping[str, object]) -> bool:
    """The client asked a stream's engine to report its usage (`stream_options.include_usage`,
    which vLLM takes only as a boolean); a stream that did not is settled from the gateway's count."""
    options = payload.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def settled_tokens(status: str, reported_prompt: object, reported_completion: object, estimated_prompt: int) -> int | None:
    """What a finished request cost its tenant's budget; None: unknown, so the whole charge stays.

    The engine's usage where it reported it; the gateway's own prompt estimate where it did not
    (a stream without `include_usage`: the proxy then reports the SSE events it relayed as the
    completion, relay.py's EventCounter). An error answer with no usage cost its prompt at most.
    A client that left mid-answer, or an answer without usage, keeps its whole charge."""
    prompt = reported_prompt if _is_count(reported_prompt) else estimated_prompt
    if _is_count(reported_completion):
        return prompt + reported_completion
    if status.isdigit() and int(status) >= 400:
        return prompt
    return None


def _is_count(value: object) -> TypeGuard[int]:
    """A token count an engine may report (a JSON number it wrote is not trusted to be one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_OUTPUT_TOKENS


class AdmissionRejected(Refusal):
    """A request admission refuses: its key, limits, queue or body."""


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
        self._queues: dict[str, deque[asyncio.Future[None]]] = {p: deque() for p in PRIORITIES}  # waiters

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

    async def check_rate(self, tenant: Tenant, estimated_tokens: int) -> Charge | None:
        """Take from the tenant's buckets, or raise 429 with the wait until it would fit.

        `estimated_tokens` is the request's admissible cost (`admissible_tokens`), charged whole.
        Returns the charge (None when the tenant has no limit); `settle_tokens` corrects it.
        With shared state unavailable and mode closed, 503."""
        if not tenant.rate_limited:
            return None
        charged = estimated_tokens if tenant.token_bucket is not None else 0
        if self.shared is not None:
            try:
                wait = await self.shared.admit(tenant.name, tenant.limits, estimated_tokens)
            except StateUnavailable as unavailable:
                raise AdmissionRejected(
                    503, str(unavailable), "state_unavailable", retry_after_s=1.0, reason="state_unavailable"
                ) from None
            if wait is not None:
                if wait > 0:
                    raise self._rate_limited(tenant, wait)
                return Charge("shared", charged)
        now = time.monotonic()
        takes = [
            (bucket, amount)
            for bucket, amount in ((tenant.request_bucket, 1), (tenant.token_bucket, estimated_tokens))
            if bucket is not None
        ]
        wait = max((bucket.wait_s(amount, now) for bucket, amount in takes), default=0.0)
        if wait > 0:  # both buckets, or neither
            raise self._rate_limited(tenant, wait)
        for bucket, amount in takes:
            bucket.take(amount)
        return Charge("local", charged)

    @staticmethod
    def _rate_limited(tenant: Tenant, wait: float) -> AdmissionRejected:
        return AdmissionRejected(
            429,
            f"rate limit exceeded for tenant {tenant.name!r}: retry after {math.ceil(wait)} s or ask for a higher limit",
            "rate_limit_exceeded",
            retry_after_s=wait,
            reason="rate_limited",
        )

    def settle_tokens(self, tenant: Tenant, charge: Charge | None, actual_tokens: int | None) -> None:
        """Settle a charge to what the request used (`settled_tokens`), where it was charged: the
        refund is the charge less the use, so never more than was charged; use beyond it is a debt."""
        if tenant.token_bucket is None or actual_tokens is None or charge is None:
            return
        refund = charge.tokens - actual_tokens
        if charge.where == "shared" and self.shared is not None:
            self.shared.settle(tenant.name, tenant.limits, refund)
        else:
            tenant.token_bucket.settle(refund)

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
                429,
                f"gateway is at capacity and the {priority} queue is full: retry later",
                "queue_full",
                retry_after_s=1.0,
                reason="queue_full",
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except asyncio.TimeoutError:
            if not self._forget(queue, waiter) and waiter.done():
                return  # the slot arrived at the same moment as the timeout: use it
            raise AdmissionRejected(
                429,
                f"waited {self.queue_timeout_s:.0f} s in the {priority} queue: the gateway is overloaded, retry later",
                "queue_timeout",
                retry_after_s=1.0,
                reason="queue_timeout",
            ) from None
        except asyncio.CancelledError:
            if not self._forget(queue, waiter) and waiter.done():
                self.release_slot()  # the slot was handed to us just as the client left
            raise

    def _forget(self, queue: deque[asyncio.Future[None]], waiter: asyncio.Future[None]) -> bool:
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
                    if not waiter.done():
                        waiter.set_result(None)
                        return  # the slot passes on; in_flight is unchanged
        self.in_flight -= 1
