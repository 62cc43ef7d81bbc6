"""Run the consistency check: every checked request alone, then all of them inside N-way load.

The alone run sends the checked requests one after another (nothing else in flight). The
loaded run keeps `concurrency` requests in flight: it starts with filler requests to fill the
batch, then sends each checked request between `filler_per_request` fillers, and ends with
fillers so the last checked requests are also batched with others. Requests are whole
(not streamed): the check is about what comes back, not when.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from vlmserve.bench.client import RequestOptions
from vlmserve.bench.consistency.cases import CaseSet, CheckedCase, build_cases, request_body
from vlmserve.bench.consistency.compare import Answer, CaseResult, ConsistencyReport, answer_from_response, find_image_swaps
from vlmserve.bench.target import Target, check_target
from vlmserve.errors import UserError
from vlmserve.json_types import JSONObject

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class ConsistencyOptions:
    """What the check sends and what it accepts (`vlmserve consistency` flags, one-to-one)."""

    num_requests: int = 32
    num_image_requests: int = 8
    concurrency: int = 16
    output_len: int = 32
    filler_per_request: int = 1
    image_size: tuple[int, int] = (64, 64)
    min_identical: float = 1.0
    seed: int = 0
    timeout_s: float = 300.0

    def validate(self) -> None:
        if self.num_requests < 0 or self.num_image_requests < 0:
            raise UserError("--num-requests and --num-image-requests must not be negative")
        if self.num_requests + self.num_image_requests < 1:
            raise UserError("nothing to check: give --num-requests or --num-image-requests of at least 1")
        if self.num_image_requests == 1:
            raise UserError("--num-image-requests 1 cannot show an image swap; give 0 or at least 2")
        if self.concurrency < 2:
            raise UserError(f"--concurrency {self.concurrency}: give at least 2 (the loaded run needs others in flight)")
        if self.output_len < 1:
            raise UserError(f"--output-len {self.output_len}: give at least 1 token")
        if self.filler_per_request < 0:
            raise UserError(f"--filler-per-request {self.filler_per_request}: must not be negative")
        if not 0.0 <= self.min_identical <= 1.0:
            raise UserError(f"--min-identical {self.min_identical:g}: give a fraction between 0 and 1")
        if self.timeout_s <= 0:
            raise UserError(f"--timeout {self.timeout_s:g}: give seconds > 0")

    @property
    def num_fillers(self) -> int:
        checked = self.num_requests + self.num_image_requests
        return self.concurrency + checked * self.filler_per_request + (self.concurrency - 1)


class _Failed(Exception):
    """A request got no usable answer; the message says why in one line."""


async def _ask(client: httpx.AsyncClient, url: str, body: JSONObject) -> Answer:
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError as err:
        raise _Failed(f"{type(err).__name__}: {err}"[:200]) from None
    if response.status_code != 200:
        raise _Failed(f"HTTP {response.status_code}: {' '.join(response.text.split())[:200]}")
    try:
        return answer_from_response(response.json())
    except ValueError as err:
        raise _Failed(str(err)) from None


def _probe_token_detail(target: Target, timeout_s: float) -> tuple[bool, str | None]:
    """Whether the server answers a request asking for token ids/logprobs; (detail, note)."""
    url = target.base_url + CHAT_PATH
    messages = [{"role": "user", "content": "hi"}]
    with httpx.Client(timeout=timeout_s, headers=target.headers) as client:
        for detail in (True, False):
            try:
                response = client.post(url, json=request_body(target.model, messages, 2, detail))
            except httpx.HTTPError as err:
                raise UserError(f"{url}: a test request failed ({type(err).__name__}); check the server") from None
            if response.status_code == 200:
                try:
                    answer = answer_from_response(response.json())
                except ValueError:
                    raise UserError(
                        f"{url} did not return a chat completion; is --base-url an OpenAI-compatible server?"
                    ) from None
                if answer.unit == "char":
                    return (
                        False,
                        "the server returned neither token ids nor logprobs: answers are compared as text (char positions)",
                    )
                return True, None
        raise UserError(f"{url} rejected a temperature-0 chat request: HTTP {response.status_code}; check --model and the server")
    raise AssertionError("unreachable")


async def _alone(client: httpx.AsyncClient, url: str, bodies: list[JSONObject], results: list[CaseResult]) -> None:
    for body, result in zip(bodies, results):
        try:
            result.alone = await _ask(client, url, body)
        except _Failed as err:
            result.error = f"alone: {err}"


async def _loaded(
    client: httpx.AsyncClient,
    url: str,
    bodies: list[JSONObject],
    results: list[CaseResult],
    fillers: list[JSONObject],
    options: ConsistencyOptions,
) -> int:
    """The loaded run; returns how many filler requests were sent."""
    filler_iter = iter(fillers)
    queue: deque[tuple[int | None, JSONObject]] = deque()
    queue.extend((None, body) for body in itertools.islice(filler_iter, options.concurrency))
    for index, body in enumerate(bodies):
        queue.append((index, body))
        queue.extend((None, filler) for filler in itertools.islice(filler_iter, options.filler_per_request))
    queue.extend((None, body) for body in filler_iter)
    fillers_sent = sum(1 for index, _ in queue if index is None)
    in_flight = 0

    async def worker() -> None:
        nonlocal in_flight
        while queue:
            index, body = queue.popleft()
            if index is not None:
                results[index].in_flight_at_send = in_flight
            in_flight += 1
            try:
                answer = await _ask(client, url, body)
                if index is not None:
                    results[index].loaded = answer
            except _Failed as err:
                if index is not None:
                    results[index].error = f"under load: {err}"
            finally:
                in_flight -= 1

    await asyncio.gather(*(worker() for _ in range(options.concurrency)))
    return fillers_sent


def run_check(
    target: Target, options: ConsistencyOptions, progress: Callable[[str], None] = lambda _line: None
) -> ConsistencyReport:
    """Check the endpoint (one-line UserError when it is unusable), run both phases, compare."""
    options.validate()
    facts = check_target(target, RequestOptions(api="chat", model=target.model, ignore_eos=False))
    detail, note = _probe_token_detail(target, options.timeout_s)
    cases: CaseSet = build_cases(
        options.seed, options.num_requests, options.num_image_requests, options.image_size, options.num_fillers
    )
    checked: list[CheckedCase] = cases.checked
    bodies = [request_body(target.model, case.messages, options.output_len, detail) for case in checked]
    fillers = [request_body(target.model, messages, 2 * options.output_len, False) for messages in cases.fillers]
    results = [CaseResult(case.case_id, case.kind) for case in checked]
    url = target.base_url + CHAT_PATH

    async def both() -> int:
        limits = httpx.Limits(max_connections=options.concurrency + 4)
        async with httpx.AsyncClient(timeout=options.timeout_s, headers=target.headers, limits=limits) as client:
            progress(f"alone: {len(bodies)} checked requests, one at a time")
            await _alone(client, url, bodies, results)
            progress(f"under load: the same {len(bodies)} inside {options.concurrency}-way load")
            return await _loaded(client, url, bodies, results, fillers, options)

    fillers_sent = asyncio.run(both())
    notes = [note] if note else []
    swaps = find_image_swaps(results, {case.case_id: case.question for case in checked})
    report = ConsistencyReport(
        base_url=target.base_url,
        model=target.model,
        concurrency=options.concurrency,
        min_identical=options.min_identical,
        fillers_sent=fillers_sent,
        simulated=facts.simulated,
        results=results,
        image_swaps=swaps,
        notes=notes,
    )
    distinct, answered = report.distinct_alone_image_answers()
    if answered >= 2 and distinct < answered:
        report.notes.append(
            f"alone, the {answered} image cases got only {distinct} distinct answers: the model does not tell "
            "every image apart, so a swap between those it confuses cannot be seen"
        )
    return report
