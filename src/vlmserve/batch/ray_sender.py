"""The Ray Data stage of `vlmserve batch --runner ray`: a pool actor that POSTs rows to the endpoint.

It runs on Ray workers, so it imports nothing from Ray and holds no file: each batch of rows
({custom_id, url, body as JSON text}) becomes a batch of results ({custom_id, line, cause,
tokens, retries, no_answer}) that Ray Data hands back to the driver, which alone writes the
output (`ray_runner`). The line is built here with the built-in runner's own `Result`, so both
runners write the same bytes for the same answer.

`__call__` is a coroutine: Ray Data then runs several batches of one actor at once on the
actor's event loop, and the semaphore keeps the actor's requests in flight at its share of
`--concurrency`, so one slow batch does not leave the actor idle.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import numpy as np

from vlmserve.batch.output import Result
from vlmserve.batch.send import NoAnswer, RetryPolicy, send_with_retries

RESULT_COLUMNS = ("custom_id", "line", "cause", "prompt_tokens", "completion_tokens", "retries", "no_answer")


def request_row(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, str]:
    """A sendable input line as a Ray Data row: the body stays JSON text, since bodies of
    different shapes cannot share one Arrow schema."""
    return {"custom_id": custom_id, "url": url, "body": json.dumps(body, separators=(",", ":"))}


class RaySender:
    """One Ray actor: an HTTP session to the endpoint, `concurrency` requests in flight at most."""

    def __init__(
        self, root: str, headers: dict[str, str], concurrency: int, request_timeout_s: float, retry: RetryPolicy
    ) -> None:
        self.root = root
        self.headers = headers
        self.concurrency = concurrency
        self.request_timeout_s = request_timeout_s
        self.retry = retry
        self.slots: asyncio.Semaphore | None = None
        self.session: aiohttp.ClientSession | None = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        """Made on first use, on the event loop Ray Data runs this actor's batches on."""
        if self.session is None:
            self.slots = asyncio.Semaphore(self.concurrency)
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
                connector=aiohttp.TCPConnector(limit=self.concurrency),
            )
        return self.session

    async def _send_one(self, session: aiohttp.ClientSession, custom_id: str, url: str, body: str) -> dict[str, Any]:
        assert self.slots is not None
        async with self.slots:
            try:
                answer = await send_with_retries(session, self.root + url, json.loads(body), self.headers, self.retry)
            except NoAnswer as err:
                return {
                    "custom_id": custom_id,
                    "line": b"",
                    "cause": "",
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "retries": self.retry.max_retries,
                    "no_answer": str(err) or "no answer",
                }
        result = Result.answered(custom_id, answer.status_code, answer.request_id, answer.body)
        return {
            "custom_id": custom_id,
            "line": result.line,
            "cause": result.cause or "",
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "retries": answer.retries,
            "no_answer": "",
        }

    async def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        session = self._ensure_session()
        rows = await asyncio.gather(
            *(
                self._send_one(session, str(custom_id), str(url), str(body))
                for custom_id, url, body in zip(batch["custom_id"], batch["url"], batch["body"])
            )
        )
        return {column: [row[column] for row in rows] for column in RESULT_COLUMNS}
