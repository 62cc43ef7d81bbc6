"""Where rate limits and token budgets live: this process, or a Redis every gateway shares.

`vlmserve gateway --state redis://HOST:PORT/DB` makes every worker process and every gateway
instance draw a tenant's limits from the same atomic buckets (redis_buckets.py); without it
each process keeps its own (admission.TokenBucket). This module is the facade admission calls:

- `admit` answers "admitted", "wait N s", or "not decided here" (`None`: Redis is unavailable and
  the operator chose `--state-unavailable open`, so the caller uses its per-process buckets and
  keeps serving); with `closed` it raises `StateUnavailable`, which the gateway turns into a 503.
- A failed call marks Redis unavailable at once, so no request waits out a timeout during an
  outage; a background probe writes (`_check_writable`) every `probe_interval_s` until one succeeds.
  Buckets Redis lost in a restart start full, as a new tenant's do.
- One timeout (`--state-timeout`) bounds every Redis call, connecting included; redis-py's own
  retries are off, so a call costs at most that long.
- The client is made in `start()` (inside the serving process's event loop), never at import or
  before a fork: each worker process gets its own connections. A password Redis refuses stops the
  gateway there with one line; an unreachable Redis does not (it may start after the gateway).
- Settles never make a response wait, nor cost a round trip of their own while the tenant keeps
  sending (`settle`); through an outage they stay pending here, so only a process that ends with
  some pending loses them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from vlmserve.errors import UserError
from vlmserve.gateway.redis_buckets import KEY_PREFIX, BucketLimits, RedisBuckets

log = logging.getLogger("vlmserve.gateway")

# The flags' names, defined once: the CLI declares them, and every writer of a gateway command
# line (deploy/front_door.py, export/k8s.py) takes them from here (cli/ is above both layers).
STATE_FLAG = "--state"
STATE_UNAVAILABLE_FLAG = "--state-unavailable"
STATE_TIMEOUT_FLAG = "--state-timeout"
STATE_SCHEMES = ("redis", "rediss")
UNAVAILABLE_MODES = ("open", "closed")
STATE_ENV = "VLMSERVE_GATEWAY_STATE"
DEFAULT_TIMEOUT_S = 0.25
PROBE_INTERVAL_S = 1.0
SETTLE_INTERVAL_S = 0.5
MAX_TIMEOUT_S = 30.0


class StateUnavailable(Exception):
    """Redis cannot decide and the operator chose to refuse rather than admit on local limits."""


@dataclass(frozen=True)
class StateURL:
    """A checked `--state` URL; `redacted` is what logs and /health show (no password)."""

    url: str
    redacted: str


def parse_state_url(url: str) -> StateURL:
    """Check a `--state` value; a problem is one line that says how to write it."""
    shown, hint = _shown(url), "write it as redis://[:PASSWORD@]HOST[:PORT][/DB] (rediss:// for TLS)"
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as err:
        raise UserError(f"--state {shown!r} is not a valid URL ({err}): {hint}") from None
    db = parts.path.strip("/")
    problem = (
        "the scheme must be redis:// or rediss://"
        if parts.scheme not in STATE_SCHEMES
        else "it names no host"
        if not parts.hostname
        else "port 0 is not a Redis port"
        if port == 0
        else "the database after the host must be a number like /0"
        if db and not db.isdigit()
        else "no query or fragment is read"
        if parts.query or parts.fragment
        else None
    )
    if problem is not None:
        raise UserError(f"--state {shown!r}: {problem}; {hint}")
    return StateURL(url.strip(), shown)


def check_state_settings(url: str | None, unavailable: str, timeout_s: float) -> None:
    """The shared-state settings of a gateway (CLI, `vlmserve up`, tests build the same checks)."""
    if url is not None:
        parse_state_url(url)
    if unavailable not in UNAVAILABLE_MODES:
        raise UserError(
            f"--state-unavailable {unavailable!r}: choose open (admit on per-process limits) "
            "or closed (refuse with 503) for when Redis is unreachable"
        )
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise UserError(
            f"--state-timeout must be more than 0 and at most {MAX_TIMEOUT_S:.0f} seconds "
            f"(a Redis call this slow is an outage; the default is {DEFAULT_TIMEOUT_S})"
        )


def _shown(url: str) -> str:
    """The URL without its password (and cut short), safe for logs and error messages."""
    try:
        parts = urlsplit(url.strip())
        if parts.password is not None:
            host = parts.hostname or ""
            host = f"[{host}]" if ":" in host else host  # IPv6 keeps its brackets
            netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
            parts = parts._replace(netloc=netloc)
        shown = parts.geturl()
    except ValueError:
        shown = url.split("@")[-1]
    return ascii(shown)[1:-1][:200]


def redis_failures() -> tuple[type[BaseException], ...]:
    """What a Redis call may raise when Redis (not this code) is the problem."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


def error_kind(err: BaseException) -> str:
    """The label of `vlmserve_gateway_state_errors_total` for a failed Redis call."""
    from redis import exceptions as redis_errors

    if isinstance(err, (redis_errors.AuthenticationError, redis_errors.NoPermissionError)):
        return "auth"
    if isinstance(err, (redis_errors.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(err, (redis_errors.ConnectionError, OSError)):
        return "connection"
    if isinstance(err, redis_errors.ResponseError):
        return "response"
    return "other"


class SharedState:
    """The Redis side of admission for one gateway process, with its availability and fallback."""

    def __init__(
        self,
        url: str,
        *,
        unavailable: str = "open",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        probe_interval_s: float = PROBE_INTERVAL_S,
        settle_interval_s: float = SETTLE_INTERVAL_S,
        on_error: Callable[[str], None] = lambda kind: None,
        on_fallback: Callable[[str], None] = lambda mode: None,
    ) -> None:
        check_state_settings(url, unavailable, timeout_s)
        self.url = parse_state_url(url)
        self.unavailable_mode = unavailable
        self.timeout_s = timeout_s
        self.probe_interval_s = probe_interval_s
        self.settle_interval_s = settle_interval_s
        self.available = False
        self._on_error = on_error
        self._on_fallback = on_fallback
        self._client: Any = None
        self._buckets: RedisBuckets | None = None
        self._probe: asyncio.Task | None = None
        self._flusher: asyncio.Task | None = None
        self._refunds: dict[str, tuple[BucketLimits, float]] = {}  # tenant -> (limits, tokens to give back)
        self._last_error = ""

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (in the serving process's loop) and try one write; a refused password stops the gateway."""
        from redis import exceptions as redis_errors
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._client = Redis.from_url(
            self.url.url,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._buckets = RedisBuckets(self._client)
        self._flusher = asyncio.get_running_loop().create_task(self._flush_refunds_every_interval())
        try:
            await self._call(self._check_writable())
        except (redis_errors.AuthenticationError, redis_errors.NoPermissionError) as err:
            await self.close()
            raise UserError(
                f"--state {self.url.redacted}: Redis refused the credentials ({_one_line(err)}); "
                "put the right password in the URL (redis://:PASSWORD@HOST:PORT/DB)"
            ) from None
        except redis_failures() as err:
            self._mark_unavailable(err)
            log.warning(
                "shared state %s is unreachable at start (%s): admitting %s until it answers",
                self.url.redacted,
                _one_line(err),
                self._fallback_words(),
            )
            return
        self.available = True
        log.info("admission state shared through %s (if unreachable: %s)", self.url.redacted, self._fallback_words())

    async def close(self) -> None:
        for task in (self._probe, self._flusher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._probe = self._flusher = None
        if self.available:
            await self._flush_refunds()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- decisions -----------------------------------------------------------------------------

    async def admit(self, tenant: str, limits: BucketLimits, tokens: float) -> float | None:
        """0: admitted (charged in Redis); > 0: seconds until it would fit; None: decide locally.

        Raises StateUnavailable when Redis cannot decide and the mode is closed."""
        if self.available and self._buckets is not None:
            _, refund = self._refunds.pop(tenant, (limits, 0.0))
            try:
                result = await self._call(self._buckets.admit(tenant, limits, tokens, refund))
            except redis_failures() as err:
                self._mark_unavailable(err)
                self.settle(tenant, limits, refund)  # not applied: keep it for later
            else:
                self._count_replaced(result.replaced_keys, tenant)
                return 0.0 if result.admitted else max(result.wait_s, 1e-6)
        self._on_fallback(self.unavailable_mode)
        if self.unavailable_mode == "closed":
            raise StateUnavailable(
                f"the gateway's shared rate-limit state ({self.url.redacted}) is unreachable and the gateway "
                "refuses requests it cannot count (--state-unavailable closed): retry shortly"
            )
        return None

    def settle(self, tenant: str, limits: BucketLimits, refund: float) -> None:
        """Give back `refund` tokens (negative: charge more) of a Redis-charged estimate, soon:
        with the tenant's next admit, or within `settle_interval_s`."""
        if refund == 0 or limits.tokens_per_s <= 0:
            return
        _, pending = self._refunds.get(tenant, (limits, 0.0))
        self._refunds[tenant] = (limits, pending + refund)

    async def _flush_refunds_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.settle_interval_s)
            if self.available and self._refunds:
                await self._flush_refunds()

    async def _flush_refunds(self) -> None:
        """Send every pending refund on its own (their tenants sent nothing since)."""
        assert self._buckets is not None
        pending, self._refunds = self._refunds, {}
        for tenant, (limits, refund) in pending.items():
            if not self.available:
                self.settle(tenant, limits, refund)
                continue
            try:
                replaced = await self._call(self._buckets.settle(tenant, limits, refund))
            except redis_failures() as err:
                self._mark_unavailable(err)
                self.settle(tenant, limits, refund)
            else:
                self._count_replaced(replaced, tenant)

    def describe(self) -> dict[str, Any]:
        """For /health: where the state is, whether it answers, and what happens when it does not."""
        return {
            "backend": self.url.redacted,
            "available": self.available,
            "when_unavailable": self.unavailable_mode,
            **({"last_error": self._last_error} if not self.available and self._last_error else {}),
        }

    # ---- availability --------------------------------------------------------------------------

    async def _call(self, awaitable: Any) -> Any:
        """One Redis call within the timeout (the socket timeouts bound reads and connects; this
        bounds the whole, e.g. a Redis that accepts the connection and never answers)."""
        async with asyncio.timeout(self.timeout_s * 2):
            return await awaitable

    def _mark_unavailable(self, err: BaseException) -> None:
        kind = error_kind(err)
        self._on_error(kind)
        self._last_error = f"{kind}: {_one_line(err)}"
        if self.available:
            log.warning(
                "shared state %s failed (%s): admitting %s until it answers again",
                self.url.redacted,
                self._last_error,
                self._fallback_words(),
            )
        self.available = False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_back())

    async def _probe_until_back(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self._call(self._check_writable())
            except redis_failures() as err:
                self._last_error = f"{error_kind(err)}: {_one_line(err)}"
                continue
            self.available = True
            log.info("shared state %s answers again: limits are shared across gateways again", self.url.redacted)
            return

    async def _check_writable(self) -> None:
        """A write, not a PING: a Redis out of memory or turned read-only (a replica after a
        failover) answers PING but refuses every bucket update."""
        await self._client.set(f"{KEY_PREFIX}probe", "1", px=10_000)

    def _count_replaced(self, replaced: int, tenant: str) -> None:
        if replaced:
            self._on_error("wrong_type")
            log.warning(
                "shared state: a key of tenant %r under %s was not a bucket (another program wrote it?); replaced it",
                tenant,
                self.url.redacted,
            )

    def _fallback_words(self) -> str:
        return (
            "on per-process limits (--state-unavailable open)"
            if self.unavailable_mode == "open"
            else "nothing with a limit: 503 (--state-unavailable closed)"
        )


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return ascii(text)[1:-1][:160]
