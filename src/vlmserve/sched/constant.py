"""Constant-latency mode (`--ttft-ms/--itl-ms`): fixed TTFT and inter-token latency per request.

llm-d-inference-sim's model, for tests that want predictable timing rather than
emergent queueing: up to `max_num_seqs` requests run at once (the rest wait FIFO);
a running request emits its first token `ttft_s` after it was admitted and one
token every `itl_s` after that. There are no shared steps, so a per-request timing
cannot be expressed as a StepCostModel; instead this class offers the Scheduler's
interface (add/abort/has_work/step) plus `next_event_s()`, the time of the next
token due, so the engine loop can sleep until then.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from vlmserve.sched.scheduler import SimRequest, StepResult, check_new_request
from vlmserve.sched.step_cost import StepContents

EMISSION_WINDOW_S = 0.0005
"""Tokens due within this window of each other are emitted together (fewer wake-ups)."""
MAX_TOKENS_PER_STEP = 2048
"""When the caller has fallen behind, emit the backlog in bounded steps (keeps its loop responsive)."""

_EMPTY_CONTENTS = StepContents(prefill_tokens=0, prefill_seqs=0, decode_seqs=0, kv_tokens_read=0)


@dataclass
class _ConstantRequest:
    request_id: str
    num_prompt_tokens: int
    max_output_tokens: int
    num_output_tokens: int = 0
    running: bool = False
    active: bool = True


class ConstantLatencyScheduler:
    """Per-request fixed TTFT and ITL, bounded concurrency, FIFO waiting queue."""

    is_constant_latency = True

    def __init__(self, ttft_s: float, itl_s: float, max_num_seqs: int = 256, max_model_len: int = 8192) -> None:
        if ttft_s < 0 or itl_s < 0:
            raise ValueError("ttft and itl must not be negative")
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.requests: dict[str, _ConstantRequest] = {}
        self.waiting: deque[_ConstantRequest] = deque()
        self._due: list[tuple[float, int, _ConstantRequest]] = []
        self._sequence = 0
        self._num_running = 0
        self.num_preemptions_total = 0

    def add_request(self, request: SimRequest) -> None:
        check_new_request(request, self.requests, self.max_model_len)
        state = _ConstantRequest(request.request_id, len(request.prompt_token_ids), request.max_output_tokens)
        self.requests[request.request_id] = state
        self.waiting.append(state)

    def abort_request(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state is None:
            return
        if not state.running:
            self.waiting.remove(state)
        elif state.active:
            self._num_running -= 1
        state.active = False

    def has_work(self) -> bool:
        return bool(self._due or self.waiting)

    @property
    def num_running(self) -> int:
        return self._num_running

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return 0.0

    def next_event_s(self, now_s: float) -> float | None:
        """When the next step should run: now if someone can be admitted, else the next token due."""
        if self.waiting and self._num_running < self.max_num_seqs:
            return now_s
        while self._due and not self._due[0][2].active:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def _schedule_token(self, due_s: float, state: _ConstantRequest) -> None:
        self._sequence += 1
        heapq.heappush(self._due, (due_s, self._sequence, state))

    def _admit(self, now_s: float, first_scheduled: list[tuple[str, int]]) -> None:
        """Move waiting requests into free seats; their first token is due ttft later."""
        while self.waiting and self._num_running < self.max_num_seqs:
            state = self.waiting.popleft()
            state.running = True
            self._num_running += 1
            first_scheduled.append((state.request_id, 0))
            self._schedule_token(now_s + self.ttft_s, state)

    def step(self, now_s: float) -> StepResult:
        """Admit waiting requests, then emit every token due by now (+ a small window)."""
        first_scheduled: list[tuple[str, int]] = []
        self._admit(now_s, first_scheduled)
        tokens: list[tuple[str, int]] = []
        first_token: list[str] = []
        finished: list[str] = []
        horizon = now_s + EMISSION_WINDOW_S
        due = self._due
        while due and due[0][0] <= horizon and len(tokens) < MAX_TOKENS_PER_STEP:
            due_s, _sequence, state = heapq.heappop(due)
            if not state.active:
                continue
            state.num_output_tokens += 1
            tokens.append((state.request_id, 1))
            if state.num_output_tokens == 1:
                first_token.append(state.request_id)
            if state.num_output_tokens >= state.max_output_tokens:
                finished.append(state.request_id)
                state.active = False
                self._num_running -= 1
                del self.requests[state.request_id]
            else:
                self._schedule_token(due_s + self.itl_s, state)
        if finished:
            self._admit(now_s, first_scheduled)  # freed seats are filled at once
        return StepResult(
            start_s=now_s,
            duration_s=0.0,
            contents=_EMPTY_CONTENTS,
            tokens=tokens,
            first_token=first_token,
            finished=finished,
            preempted=[],
            num_running=self._num_running,
            num_waiting=len(self.waiting),
            kv_usage=0.0,
            prefix_queries_tokens=0,
            prefix_hits_tokens=0,
            first_scheduled=first_scheduled,
        )
