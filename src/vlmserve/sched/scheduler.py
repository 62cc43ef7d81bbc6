"""A model of vLLM V1's continuous-batching scheduler (`vllm/v1/core/sched/scheduler.py`).

One call to `Scheduler.step(now_s)` is one engine step: decide what runs, price it
with a StepCostModel, advance every scheduled request, and report which requests
emitted a token, finished or were preempted. The rules follow vLLM V1:

- A token budget per step (`max_num_batched_tokens`) shared by decodes and prefills.
- RUNNING requests are scheduled first, in order; each asks for all its uncomputed
  tokens (1 for a decode), capped by the remaining budget (chunked prefill).
- If a running request cannot get KV blocks, the *last* running request is
  preempted (recompute: its blocks are freed, it goes to the front of the waiting
  queue with no computed tokens) until the allocation fits or the request itself
  was the one preempted.
- WAITING requests are admitted (FCFS) only if no request was preempted this step,
  while the budget lasts and fewer than `max_num_seqs` run. A new request first
  looks up its longest cached prefix (full blocks, chained hashes); only the rest
  is computed. Without chunked prefill a prompt that does not fit the remaining
  budget waits for the next step.
- A request emits a token in the step where its computed tokens catch up with its
  known tokens (end of prefill, or every decode step).

Times are seconds on whatever clock the caller uses (virtual in `virtual_clock.py`, the
monotonic clock in the sim engine).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vlmserve.sched.kv_cache import ROOT_HASH, BlockHash, hash_block_tokens, hash_request_blocks
from vlmserve.sched.kv_cache_manager import KVCacheManager
from vlmserve.sched.step_cost import StepContents, StepCostModel

MIN_STEP_S = 1e-4
"""Floor on a step's duration so a degenerate cost model cannot make a loop spin."""


@dataclass
class SchedulerConfig:
    """Engine limits that shape scheduling (vLLM's --max-num-seqs etc.)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_kv_blocks: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_model_len: int = 8192

    def validate(self) -> None:
        """Raise ValueError for limits vLLM would refuse to start with."""
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.num_kv_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache ({self.num_kv_blocks} blocks of {self.block_size} tokens = "
                f"{self.num_kv_blocks * self.block_size} tokens) cannot hold one request of "
                f"max_model_len={self.max_model_len}; lower max_model_len or raise num_kv_blocks"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "without chunked prefill max_num_batched_tokens must be at least max_model_len "
                f"({self.max_num_batched_tokens} < {self.max_model_len})"
            )


@dataclass
class SimRequest:
    """A request as the scheduler sees it: token ids (for prefix hashing) and an output length."""

    request_id: str
    prompt_token_ids: list[int]
    max_output_tokens: int
    arrival_s: float = 0.0
    image_tokens: int = 0
    images: int = 0
    output_token_ids: Sequence[int] | None = None
    """Ids of the tokens it will generate, if known: lets output blocks be cached too (multi-turn hits)."""
    image_items: tuple[tuple[int, int], ...] = ()
    """(content digest, pixels) of each image, for the frontend's preprocessing and cache (sched.frontend)."""


@dataclass
class StepResult:
    """What one engine step did, and the engine state after it."""

    start_s: float
    duration_s: float
    contents: StepContents
    tokens: list[tuple[str, int]]
    first_token: list[str]
    finished: list[str]
    preempted: list[str]
    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    first_scheduled: list[tuple[str, int]] = field(default_factory=list)
    """(request_id, prompt tokens served from the prefix cache) of requests scheduled for the
    first time this step: their queue time ends at start_s."""

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def check_new_request(request: SimRequest, known: Mapping[str, object], max_model_len: int) -> None:
    """Raise ValueError for a request no engine could run (shared by every scheduler)."""
    if request.request_id in known:
        raise ValueError(f"duplicate request id {request.request_id!r}")
    if not request.prompt_token_ids:
        raise ValueError("a request needs at least one prompt token")
    if request.max_output_tokens < 1:
        raise ValueError("max_output_tokens must be at least 1")
    total = len(request.prompt_token_ids) + request.max_output_tokens
    if total > max_model_len:
        raise ValueError(
            f"prompt ({len(request.prompt_token_ids)}) + max_output_tokens "
            f"({request.max_output_tokens}) exceeds max_model_len {max_model_len}"
        )


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Request:
    """Mutable scheduling state of one request (vLLM's `vllm.v1.request.Request`)."""

    __slots__ = (
        "request_id", "prompt_token_ids", "num_prompt_tokens", "max_output_tokens", "arrival_s",
        "image_tokens", "images", "output_token_ids", "num_output_tokens", "num_computed_tokens",
        "status", "block_ids", "block_hashes", "num_cached_blocks", "num_preemptions",
        "first_scheduled_s", "first_token_s",
    )  # fmt: skip

    def __init__(self, source: SimRequest, block_size: int) -> None:
        self.request_id = source.request_id
        self.prompt_token_ids = source.prompt_token_ids
        self.num_prompt_tokens = len(source.prompt_token_ids)
        self.max_output_tokens = source.max_output_tokens
        self.arrival_s = source.arrival_s
        self.image_tokens = source.image_tokens
        self.images = source.images
        self.output_token_ids = source.output_token_ids
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []
        self.block_hashes: list[BlockHash] = hash_request_blocks(self.prompt_token_ids, block_size)
        self.num_cached_blocks = 0
        self.num_preemptions = 0
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what must be computed before the next token."""
        return self.num_prompt_tokens + self.num_output_tokens

    def extend_block_hashes(self, block_size: int) -> None:
        """Hash output blocks that just became full, when the output ids are known."""
        output_ids = self.output_token_ids
        if output_ids is None:
            return
        hashes = self.block_hashes
        num_prompt = self.num_prompt_tokens
        parent = hashes[-1] if hashes else ROOT_HASH
        for block_index in range(len(hashes), self.num_tokens // block_size):
            start, end = block_index * block_size, (block_index + 1) * block_size
            if start >= num_prompt:
                block = list(output_ids[start - num_prompt : end - num_prompt])
            else:
                block = self.prompt_token_ids[start:num_prompt] + list(output_ids[0 : end - num_prompt])
            parent = hash_block_tokens(parent, block)
            hashes.append(parent)


class Scheduler:
    """vLLM V1's scheduling rules over a block-granular KV cache, priced by a StepCostModel."""

    def __init__(self, config: SchedulerConfig, cost: StepCostModel) -> None:
        config.validate()
        self.config = config
        self.cost = cost
        self.kv_cache_manager = KVCacheManager(
            config.num_kv_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions_total = 0

    # -- requests in and out ---------------------------------------------------------------
    def add_request(self, request: SimRequest) -> None:
        """Queue a request; raises ValueError if it could never run (vLLM refuses these up front)."""
        check_new_request(request, self.requests, self.config.max_model_len)
        state = Request(request, self.config.block_size)
        self.requests[request.request_id] = state
        self.waiting.append(state)

    def abort_request(self, request_id: str) -> None:
        """Drop a request wherever it is (client went away); unknown ids are ignored."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return
        if state.status == RequestStatus.RUNNING:
            self.running.remove(state)
        else:
            try:
                self.waiting.remove(state)
            except ValueError:
                pass
        self.kv_cache_manager.free(state)
        state.status = RequestStatus.FINISHED

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def next_event_s(self, now_s: float) -> float | None:
        """A priced scheduler steps back to back while it has work: the next step starts now."""
        return now_s if self.has_work() else None

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_cache_manager.usage

    # -- one engine step -------------------------------------------------------------------
    def step(self, now_s: float) -> StepResult:
        """Schedule, price and run one step that starts at `now_s`."""
        config = self.config
        kv = self.kv_cache_manager
        token_budget = config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []

        # 1. RUNNING requests, in order.
        running = self.running
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            num_new_tokens = min(request.num_tokens - request.num_computed_tokens, token_budget)
            if num_new_tokens <= 0:
                req_index += 1
                continue
            scheduled_ok = True
            while not kv.allocate_slots(request, num_new_tokens):
                victim = running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    scheduled_ok = False
                    break
            if not scheduled_ok:
                break
            scheduled.append((request, num_new_tokens))
            token_budget -= num_new_tokens
            req_index += 1

        # 2. WAITING requests, only if nobody was preempted.
        prefix_queries = 0
        prefix_hits = 0
        first_scheduled: list[tuple[str, int]] = []
        image_tokens = 0
        images = 0
        if not preempted:
            waiting = self.waiting
            while waiting and token_budget > 0 and len(running) < config.max_num_seqs:
                request = waiting[0]
                new_computed_blocks: list[int] = []
                num_hit_tokens = 0
                if request.num_computed_tokens == 0:
                    new_computed_blocks, num_hit_tokens = kv.get_computed_blocks(request)
                num_new_tokens = request.num_tokens - request.num_computed_tokens - num_hit_tokens
                if not config.enable_chunked_prefill and num_new_tokens > token_budget:
                    break
                num_new_tokens = min(num_new_tokens, token_budget)
                if not kv.allocate_slots(request, num_new_tokens, new_computed_blocks):
                    break
                waiting.popleft()
                running.append(request)
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens += num_hit_tokens
                if config.enable_prefix_caching:
                    prefix_queries += request.num_tokens
                    prefix_hits += num_hit_tokens
                if request.first_scheduled_s is None:
                    request.first_scheduled_s = now_s
                    first_scheduled.append((request.request_id, num_hit_tokens))
                if request.images and num_hit_tokens < request.num_prompt_tokens - 1:
                    image_tokens += request.image_tokens
                    images += request.images
                scheduled.append((request, num_new_tokens))
                token_budget -= num_new_tokens

        # 3. Price the step.
        prefill_tokens = 0
        prefill_seqs = 0
        decode_seqs = 0
        kv_tokens_read = 0
        for request, num_new_tokens in scheduled:
            context = request.num_computed_tokens + num_new_tokens
            kv_tokens_read += context
            if num_new_tokens == 1 and request.num_output_tokens > 0 and context == request.num_tokens:
                decode_seqs += 1
            else:
                prefill_tokens += num_new_tokens
                prefill_seqs += 1
        contents = StepContents(
            prefill_tokens=prefill_tokens,
            prefill_seqs=prefill_seqs,
            decode_seqs=decode_seqs,
            kv_tokens_read=kv_tokens_read,
            image_tokens=image_tokens,
            images=images,
        )
        duration_s = max(self.cost.step_time_s(contents), MIN_STEP_S)
        end_s = now_s + duration_s

        # 4. Advance requests; those caught up sample one token.
        tokens: list[tuple[str, int]] = []
        first_token: list[str] = []
        finished: list[str] = []
        block_size = config.block_size
        max_model_len = config.max_model_len
        for request, num_new_tokens in scheduled:
            request.num_computed_tokens += num_new_tokens
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk that does not finish the prompt
            request.num_output_tokens += 1
            tokens.append((request.request_id, 1))
            if request.first_token_s is None:
                request.first_token_s = end_s
                first_token.append(request.request_id)
            if request.output_token_ids is not None and request.num_tokens % block_size == 0:
                request.extend_block_hashes(block_size)
            if request.num_output_tokens >= request.max_output_tokens or request.num_tokens >= max_model_len:
                finished.append(request.request_id)
                request.status = RequestStatus.FINISHED
                kv.free(request)
                del self.requests[request.request_id]
        if finished:
            self.running = [request for request in running if request.status == RequestStatus.RUNNING]

        self.num_preemptions_total += len(preempted)
        return StepResult(
            start_s=now_s,
            duration_s=duration_s,
            contents=contents,
            tokens=tokens,
            first_token=first_token,
            finished=finished,
            preempted=[request.request_id for request in preempted],
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=kv.usage,
            prefix_queries_tokens=prefix_queries,
            prefix_hits_tokens=prefix_hits,
            first_scheduled=first_scheduled,
        )

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption: free its blocks and put it first in the waiting queue."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
