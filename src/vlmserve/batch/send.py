"""Send one batch request with retries: back off on 429/5xx and on lost connections.

The server's Retry-After wins over our own back-off (capped so a bad header cannot park
the job for hours). A request that never got an HTTP answer raises `NoAnswer`: the runner
leaves that line unanswered so a rerun sends it again, instead of recording a failure.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from dataclasses import dataclass

import aiohttp

from vlmserve.json_types import JSONObject, JSONValue

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 120.0


class NoAnswer(Exception):
    """No HTTP response after every retry (connection refused, reset, timed out)."""


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def backoff_s(self, attempt: int) -> float:
        """Exponential back-off with jitter, so many workers do not retry in lockstep."""
        return min(self.max_delay_s, self.base_delay_s * 2**attempt) * random.uniform(0.5, 1.0)


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass
class Answer:
    status_code: int
    request_id: str | None
    body: JSONValue
    retries: int


def _decode(payload: bytes) -> JSONValue:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack (the error body says so)
        return {"error": {"message": payload.decode(errors="replace")[:2000], "type": "non_json_response"}}


async def send_with_retries(
    session: aiohttp.ClientSession, url: str, body: JSONObject, headers: dict[str, str], policy: RetryPolicy
) -> Answer:
    """POST until a final answer; 429/5xx and connection errors are retried."""
    last_error = ""
    for attempt in range(policy.max_retries + 1):
        final = attempt == policy.max_retries
        try:
            async with session.post(url, json=body, headers=headers) as response:
                payload = await response.read()
                if response.status in RETRY_STATUSES and not final:
                    delay = retry_after_s(response.headers.get("Retry-After"))
                    await asyncio.sleep(delay if delay is not None else policy.backoff_s(attempt))
                    continue
                decoded = _decode(payload)
                request_id = response.headers.get("x-request-id")
                if request_id is None and isinstance(decoded, dict):
                    ident = decoded.get("id")
                    request_id = None if ident is None else str(ident)
                return Answer(response.status, request_id, decoded, attempt)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            last_error = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            if final:
                break
            await asyncio.sleep(policy.backoff_s(attempt))
    raise NoAnswer(last_error)
