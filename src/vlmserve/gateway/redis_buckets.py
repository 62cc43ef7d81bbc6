"""Token buckets kept in Redis, so every gateway process and instance draws from the same ones.

The rules kept:
- One decision, one round trip, atomic: a Lua script refills a tenant's request bucket and its
  token budget, checks both, and takes from both only when both fit (`admit`). Redis runs a
  script alone, so two gateways admitting at the same instant cannot both take the last token.
- Redis's clock (`TIME`, inside the script), never a gateway's: gateways on different machines
  need not agree on the time.
- The budget rule is admission.py's (`TokenBucket`), so falling back to it changes where a bucket
  lives, not what it allows (tests/helpers/budget_cases.py runs one table against both). A settle
  rides along with the tenant's next `admit` (no extra round trip), or goes by `settle`.
- Every key expires once its bucket would be full again (a full bucket and a missing key mean
  the same), so tenants that stop sending leave nothing behind; the expiry is capped at
  MAX_TTL_MS, so no level or rate can make PEXPIRE refuse it.
- A key of another type under the prefix (someone SET it by hand) is replaced, and the call
  says so (`replaced`), rather than failing every request of that tenant.

Keys: `vlmserve:admission:{TENANT}:req` and `...:tok`, hashes of `tokens` and `at_us`. The
braces are a Redis Cluster hash tag: a tenant's two keys live in one slot, as a script needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

KEY_PREFIX = "vlmserve:admission:"
MAX_TTL_MS = 10**15
"""The longest a bucket key lives (about 31,700 years): PEXPIRE refuses a time that overflows."""

# Shared by both scripts: bring a bucket to now. Wrong-typed keys are deleted (flagged back).
_REFILL = """
local function load(key, rate, capacity, now_us)
  local kind = redis.call('TYPE', key)['ok']
  local replaced = 0
  if kind ~= 'hash' and kind ~= 'none' then
    redis.call('DEL', key)
    replaced = 1
  end
  local stored = redis.call('HMGET', key, 'tokens', 'at_us')
  local tokens = tonumber(stored[1])
  local at_us = tonumber(stored[2])
  if tokens == nil or at_us == nil then
    return capacity, replaced
  end
  local elapsed_s = math.max(0, now_us - at_us) / 1e6
  return math.min(capacity, tokens + elapsed_s * rate), replaced
end

local function store(key, tokens, now_us, ttl_ms)
  redis.call('HSET', key, 'tokens', tostring(tokens), 'at_us', tostring(now_us))
  redis.call('PEXPIRE', key, ttl_ms)
end

-- Milliseconds until a bucket at `tokens` is full again, plus a second; capped (MAX_TTL_MS).
local function ttl_ms(capacity, tokens, rate)
  return math.min(tonumber(ARGV[#ARGV]), math.ceil(1000 * math.max(0, capacity - tokens) / rate) + 1000)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
"""

# KEYS: request bucket, token bucket. ARGV: req_rate, req_capacity, tok_rate, tok_capacity,
# tokens wanted (the whole cost), tokens given back first (settles of earlier requests riding
# along; 0: none; negative: a debt), MAX_TTL_MS (last, as ttl_ms reads it).
# A rate of 0 means "no such limit" (its key is not touched).
# Returns {admitted 0/1, wait in microseconds, keys replaced}.
ADMIT_SCRIPT = (
    _REFILL
    + """
local now = now_us()
local req_rate, req_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local tok_rate, tok_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local wanted = tonumber(ARGV[5])
local need = math.min(wanted, tok_cap)  -- a cost over the whole budget waits for a full bucket
local refund = tonumber(ARGV[6])
local replaced = 0
local wait_s = 0
local req_tokens, tok_tokens, r
if req_rate > 0 then
  req_tokens, r = load(KEYS[1], req_rate, req_cap, now)
  replaced = replaced + r
  local need = math.min(1, req_cap)
  if req_tokens < need then wait_s = math.max(wait_s, (need - req_tokens) / req_rate) end
end
if tok_rate > 0 then
  tok_tokens, r = load(KEYS[2], tok_rate, tok_cap, now)
  replaced = replaced + r
  tok_tokens = math.min(tok_cap, tok_tokens + refund)
  if tok_tokens < need then wait_s = math.max(wait_s, (need - tok_tokens) / tok_rate) end
end
if wait_s > 0 then
  local wait_us = math.min(1000 * tonumber(ARGV[#ARGV]), math.ceil(wait_s * 1e6))  -- a Redis integer
  if tok_rate > 0 and refund ~= 0 then  -- keep the refund
    store(KEYS[2], tok_tokens, now, ttl_ms(tok_cap, tok_tokens, tok_rate))
  end
  return {0, wait_us, replaced}
end
if req_rate > 0 then
  req_tokens = req_tokens - math.min(1, req_cap)
  store(KEYS[1], req_tokens, now, ttl_ms(req_cap, req_tokens, req_rate))
end
if tok_rate > 0 then
  tok_tokens = tok_tokens - wanted
  store(KEYS[2], tok_tokens, now, ttl_ms(tok_cap, tok_tokens, tok_rate))
end
return {1, 0, replaced}
"""
)

# KEYS: token bucket. ARGV: tok_rate, tok_capacity, tokens to give back (negative: a debt), MAX_TTL_MS.
# Returns {tokens now (rounded), keys replaced}.
SETTLE_SCRIPT = (
    _REFILL
    + """
local now = now_us()
local rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, replaced = load(KEYS[1], rate, cap, now)
tokens = math.min(cap, tokens + tonumber(ARGV[3]))
store(KEYS[1], tokens, now, ttl_ms(cap, tokens, rate))
return {math.floor(tokens), replaced}
"""
)


@dataclass(frozen=True)
class BucketLimits:
    """A tenant's limits as the scripts take them; 0 means no such limit."""

    requests_per_s: float = 0.0
    request_capacity: float = 0.0
    tokens_per_s: float = 0.0
    token_capacity: float = 0.0


@dataclass(frozen=True)
class AdmitResult:
    admitted: bool
    wait_s: float
    replaced_keys: int


def bucket_keys(tenant: str, prefix: str = KEY_PREFIX) -> tuple[str, str]:
    """(request bucket key, token bucket key) of a tenant; one hash slot (`{tenant}`)."""
    return f"{prefix}{{{tenant}}}:req", f"{prefix}{{{tenant}}}:tok"


class RedisBuckets:
    """The two scripts, bound to one `redis.asyncio.Redis` client (which carries the timeouts).

    redis-py sends EVALSHA and reloads a script Redis no longer has (after a restart) by itself."""

    def __init__(self, client: Any, prefix: str = KEY_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self._admit = client.register_script(ADMIT_SCRIPT)
        self._settle = client.register_script(SETTLE_SCRIPT)

    async def admit(self, tenant: str, limits: BucketLimits, tokens: float, refund: float = 0.0) -> AdmitResult:
        """Take one request and `tokens` from the tenant's buckets, or neither and say how long to wait.

        `refund` tokens (negative: a charge) from earlier requests' settles are applied first,
        admitted or not: one round trip instead of two."""
        admitted, wait_us, replaced = await self._admit(
            keys=list(bucket_keys(tenant, self.prefix)),
            args=[
                _num(limits.requests_per_s),
                _num(limits.request_capacity),
                _num(limits.tokens_per_s),
                _num(limits.token_capacity),
                _num(max(0.0, _finite(tokens))),
                _num(refund),
                str(MAX_TTL_MS),
            ],
        )
        return AdmitResult(bool(int(admitted)), int(wait_us) / 1e6, int(replaced))

    async def settle(self, tenant: str, limits: BucketLimits, refund: float) -> int:
        """Give back `refund` tokens (negative: charge more) to the token budget; returns keys replaced."""
        if limits.tokens_per_s <= 0 or refund == 0:
            return 0
        _, replaced = await self._settle(
            keys=[bucket_keys(tenant, self.prefix)[1]],
            args=[_num(limits.tokens_per_s), _num(limits.token_capacity), _num(refund), str(MAX_TTL_MS)],
        )
        return int(replaced)


def _num(value: float) -> str:
    """A float as Lua's tonumber reads it (repr keeps every digit, never an exponent Lua misreads)."""
    return repr(_finite(value))


def _finite(value: float) -> float:
    """`value` as a float, or ValueError: Lua reads no `inf` or `nan` (the script would fail, and
    shared state with it for every tenant). Admission refuses such limits and costs before they
    get here; this refuses them again rather than send one."""
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"a bucket number must be finite, got {str(value)[:40]}")
    return number
