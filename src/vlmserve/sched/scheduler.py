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
- Images (vLLM's `_try_schedule_encoder_inputs`): a chunk that reaches an image whose encoder
  output is not in the encoder cache encodes it in that step, if the image fits what is left of
  the step's encoder budget (`max_num_encoder_input_tokens`) and the encoder cache has room
  (`encoder_cache_size`); otherwise the chunk stops just before the image and the prefill waits
  (a request that cannot schedule a token is skipped if running, and ends admission if waiting).
  With `disable_chunked_mm_input` a chunk never ends inside an image. A step's
  `StepContents.images`/`image_tokens` are the images encoded in it; the cache entries are
  dropped once the prefill has consumed them (sched.encoder_cache_manager).

Times are seconds on whatever clock the caller uses (virtual in `virtual_clock.py`, the
monotonic clock in the sim engine).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vlmserve.sched.encoder_cache_manager import (
    EncoderCacheManager,
    EncoderInput,
    PlaceholderRange,
    check_positions,
    layout_encoder_inputs,
)
from vlmserve.sched.kv_cache import ROOT_HASH, BlockHash, hash_block_tokens, hash_request_blocks
from vlmserve.sched.kv_cache_manager import KVCacheManager
from vlmserve.sched.lora_slots import LoraConfig, LoraSlots
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
    max_num_encoder_input_tokens: int | None = None
    """Encoder tokens (image placeholders) one step may encode; None: max_num_batched_tokens, as vLLM."""
    encoder_cache_size: int | None = None
    """Encoder output tokens the encoder cache holds; None: max_num_batched_tokens, as vLLM."""
    disable_chunked_mm_input: bool = False
    """vLLM's --disable-chunked-mm-input: a prefill chunk never ends inside an image."""
    lora: LoraConfig | None = None
    """LoRA adapter slots and costs (sched.lora_slots); None: LoRA off."""

    @property
    def encoder_compute_budget(self) -> int:
        """The step's encoder budget with vLLM's default applied."""
        return self.max_num_encoder_input_tokens or self.max_num_batched_tokens

    @property
    def encoder_cache_tokens(self) -> int:
        """The encoder cache size with vLLM's default applied."""
        return self.encoder_cache_size or self.max_num_batched_tokens

    def validate(self) -> None:
        """Raise ValueError for limits vLLM would refuse to start with."""
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be at least 1 (leave it out for --max-num-batched-tokens), got {value}")
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
    mm_positions: tuple[PlaceholderRange, ...] | tuple[tuple[int, int], ...] = ()
    """(offset, length) of the placeholder tokens of each image to encode, aligned with image_items;
    empty: `images` images share `image_tokens` at the start of the prompt (encoder_cache_manager)."""
    lora: str | None = None
    """The LoRA adapter it runs with (SchedulerConfig.lora); None: the base model."""

    def encoder_inputs(self) -> tuple[EncoderInput, ...]:
        """The images the engine encodes for this request, in prompt order."""
        digests = tuple(digest for digest, _pixels in self.image_items)
        return layout_encoder_inputs(
            self.request_id, len(self.prompt_token_ids), self.images, self.image_tokens, self.mm_positions, digests
        )


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
    if request.mm_positions:
        check_positions(tuple(request.mm_positions), len(request.prompt_token_ids))
        if request.image_items and len(request.image_items) != len(request.mm_positions):
            raise ValueError("mm_positions and image_items must describe the same images")
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
        "first_scheduled_s", "first_token_s", "encoder_inputs", "encoder_end", "lora",
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
        self.encoder_inputs: tuple[EncoderInput, ...] = source.encoder_inputs()
        self.encoder_end = max((item.end for item in self.encoder_inputs), default=0)
        """Where the last image's placeholders end: past it a chunk needs no encoder (0: no images)."""
        self.lora = source.lora

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


@dataclass
class _StepPlan:
    """What one step has scheduled so far and the budgets it has left (the state `step`'s phases share)."""

    token_budget: int
    encoder_budget: int
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    encoded: list[EncoderInput] = field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0
    first_scheduled: list[tuple[str, int]] = field(default_factory=list)


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
        self.max_num_encoder_input_tokens = config.encoder_compute_budget
        """The step's encoder budget; raised to the largest image seen, as vLLM does at start-up."""
        self.encoder_cache_manager = EncoderCacheManager(config.encoder_cache_tokens)
        self.lora_slots = LoraSlots(config.lora) if config.lora is not None else None

    # -- requests in and out ---------------------------------------------------------------
    def add_request(self, request: SimRequest) -> None:
        """Queue a request; raises ValueError if it could never run (vLLM refuses these up front)."""
        check_new_request(request, self.requests, self.config.max_model_len)
        state = Request(request, self.config.block_size)
        if state.encoder_inputs:
            self._fit_largest_image(max(item.length for item in state.encoder_inputs))
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
        self.encoder_cache_manager.free(request_id, state.encoder_inputs)
        state.status = RequestStatus.FINISHED

    def _fit_largest_image(self, num_tokens: int) -> None:
        """vLLM raises the encoder budget and cache to the model's largest image at start-up, so one
        image always fits; the model learns image sizes from requests, so it raises them here."""
        if self.config.disable_chunked_mm_input and num_tokens > self.config.max_num_batched_tokens:
            raise ValueError(
                f"an image of {num_tokens} tokens is larger than max_num_batched_tokens "
                f"({self.config.max_num_batched_tokens}) with chunked multimodal input disabled"
            )
        self.max_num_encoder_input_tokens = max(self.max_num_encoder_input_tokens, num_tokens)
        self.encoder_cache_manager.grow(num_tokens)

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
        plan = _StepPlan(token_budget=self.config.max_num_batched_tokens, encoder_budget=self.max_num_encoder_input_tokens)
        self._schedule_running(plan)
        if self.lora_slots is not None:
            self.lora_slots.begin_step(request.lora for request, _ in plan.scheduled)
        if not plan.preempted:
            self._admit_waiting(plan, now_s)
        contents = self._step_contents(plan)
        lora_extra_s = self.lora_slots.step_extra_s() if self.lora_slots else 0.0
        duration_s = max(self.cost.step_time_s(contents) + lora_extra_s, MIN_STEP_S)
        tokens, first_token, finished = self._advance_scheduled(plan, now_s + duration_s)
        self.num_preemptions_total += len(plan.preempted)
        return StepResult(
            start_s=now_s,
            duration_s=duration_s,
            contents=contents,
            tokens=tokens,
            first_token=first_token,
            finished=finished,
            preempted=[request.request_id for request in plan.preempted],
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=self.kv_cache_manager.usage,
            prefix_queries_tokens=plan.prefix_queries,
            prefix_hits_tokens=plan.prefix_hits,
            first_scheduled=plan.first_scheduled,
        )

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Step 1: RUNNING requests, in order, preempting from the back when KV blocks run out."""
        kv = self.kv_cache_manager
        running = self.running
        req_index = 0
        while req_index < len(running) and plan.token_budget > 0:
            request = running[req_index]
            num_new_tokens = min(request.num_tokens - request.num_computed_tokens, plan.token_budget)
            to_encode: list[EncoderInput] = []
            new_encoder_budget = plan.encoder_budget
            if request.num_computed_tokens < request.encoder_end and num_new_tokens > 0:
                to_encode, num_new_tokens, new_encoder_budget = self._try_schedule_encoder_inputs(
                    request, request.num_computed_tokens, num_new_tokens, plan.encoder_budget
                )
            if num_new_tokens <= 0:
                req_index += 1  # vLLM skips it (not FCFS) so later requests may still run
                continue
            scheduled_ok = True
            while not kv.allocate_slots(request, num_new_tokens):
                victim = running.pop()
                self._preempt_request(victim)
                plan.preempted.append(victim)
                if victim is request:
                    scheduled_ok = False
                    break
            if not scheduled_ok:
                break
            self._commit_scheduled(plan, request, num_new_tokens, to_encode, new_encoder_budget)
            req_index += 1

    def _admit_waiting(self, plan: _StepPlan, now_s: float) -> None:
        """Step 2: WAITING requests, FCFS, while budget and seats last (only when nobody was preempted)."""
        config = self.config
        kv = self.kv_cache_manager
        lora_slots = self.lora_slots
        waiting = self.waiting
        skipped: list[Request] = []  # waiting requests whose adapter found no slot: they keep their place
        while waiting and plan.token_budget > 0 and len(self.running) < config.max_num_seqs:
            request = waiting[0]
            if lora_slots is not None and not lora_slots.admits(request.lora):
                skipped.append(waiting.popleft())
                continue
            new_computed_blocks: list[int] = []
            num_hit_tokens = 0
            if request.num_computed_tokens == 0:
                new_computed_blocks, num_hit_tokens = kv.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - request.num_computed_tokens - num_hit_tokens
            if not config.enable_chunked_prefill and num_new_tokens > plan.token_budget:
                break
            num_new_tokens = min(num_new_tokens, plan.token_budget)
            to_encode: list[EncoderInput] = []
            new_encoder_budget = plan.encoder_budget
            if request.num_computed_tokens + num_hit_tokens < request.encoder_end:
                to_encode, num_new_tokens, new_encoder_budget = self._try_schedule_encoder_inputs(
                    request, request.num_computed_tokens + num_hit_tokens, num_new_tokens, plan.encoder_budget
                )
                if num_new_tokens <= 0:
                    break  # its next image cannot be encoded this step: admission stops (FCFS)
            if not kv.allocate_slots(request, num_new_tokens, new_computed_blocks):
                break
            waiting.popleft()
            self._start_running(plan, request, num_hit_tokens, now_s)
            self._commit_scheduled(plan, request, num_new_tokens, to_encode, new_encoder_budget)
        waiting.extendleft(reversed(skipped))

    def _start_running(self, plan: _StepPlan, request: Request, num_hit_tokens: int, now_s: float) -> None:
        """Move an admitted request to RUNNING and count its prefix-cache hit."""
        if self.lora_slots is not None:
            self.lora_slots.admit(request.lora)
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens += num_hit_tokens
        if self.config.enable_prefix_caching:
            plan.prefix_queries += request.num_tokens
            plan.prefix_hits += num_hit_tokens
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now_s
            plan.first_scheduled.append((request.request_id, num_hit_tokens))

    def _commit_scheduled(
        self, plan: _StepPlan, request: Request, num_new_tokens: int, to_encode: list[EncoderInput], new_encoder_budget: int
    ) -> None:
        """Record a scheduled chunk: spend its tokens and put the images it encodes in the encoder cache."""
        plan.scheduled.append((request, num_new_tokens))
        plan.token_budget -= num_new_tokens
        if to_encode:
            for item in to_encode:
                self.encoder_cache_manager.allocate(request.request_id, item)
            plan.encoded += to_encode
            plan.encoder_budget = new_encoder_budget

    @staticmethod
    def _step_contents(plan: _StepPlan) -> StepContents:
        """Step 3: what the step computes, in the terms the cost model prices."""
        prefill_tokens = 0
        prefill_seqs = 0
        decode_seqs = 0
        kv_tokens_read = 0
        for request, num_new_tokens in plan.scheduled:
            context = request.num_computed_tokens + num_new_tokens
            kv_tokens_read += context
            if num_new_tokens == 1 and request.num_output_tokens > 0 and context == request.num_tokens:
                decode_seqs += 1
            else:
                prefill_tokens += num_new_tokens
                prefill_seqs += 1
        return StepContents(
            prefill_tokens=prefill_tokens,
            prefill_seqs=prefill_seqs,
            decode_seqs=decode_seqs,
            kv_tokens_read=kv_tokens_read,
            image_tokens=sum(item.length for item in plan.encoded),
            images=len(plan.encoded),
        )

    def _advance_scheduled(self, plan: _StepPlan, end_s: float) -> tuple[list[tuple[str, int]], list[str], list[str]]:
        """Step 4: advance requests; those caught up sample one token, and finished ones free their blocks.

        Returns (tokens emitted, requests with their first token, requests finished)."""
        tokens: list[tuple[str, int]] = []
        first_token: list[str] = []
        finished: list[str] = []
        block_size = self.config.block_size
        max_model_len = self.config.max_model_len
        for request, num_new_tokens in plan.scheduled:
            request.num_computed_tokens += num_new_tokens
            if request.num_computed_tokens - num_new_tokens < request.encoder_end:
                self._free_consumed_encoder_inputs(request)
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
                self.kv_cache_manager.free(request)
                self.encoder_cache_manager.free(request.request_id, request.encoder_inputs)
                del self.requests[request.request_id]
        if finished:
            self.running = [request for request in self.running if request.status == RequestStatus.RUNNING]
        return tokens, first_token, finished

    def _try_schedule_encoder_inputs(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int, encoder_budget: int
    ) -> tuple[list[EncoderInput], int, int]:
        """The images this chunk must encode, the chunk's length after the encoder limits, and the
        encoder budget left (vLLM's rule of the same name; `num_new_tokens` > 0).

        An image is needed when the chunk [num_computed_tokens, +num_new_tokens) overlaps its
        placeholders and its output is not cached. One that does not fit the budget or the cache
        ends the chunk just before it (0 tokens when the chunk already starts inside it, after a
        prefix-cache hit): the encoder runs an image whole, so the prefill waits for it.
        """
        cache = self.encoder_cache_manager
        chunk_end = num_computed_tokens + num_new_tokens
        to_encode: list[EncoderInput] = []
        identifiers: set[object] = set()
        num_tokens_to_schedule = 0
        for item in request.encoder_inputs:
            if item.offset >= chunk_end:
                break  # not reached in this step
            if item.end <= num_computed_tokens:
                continue  # already in the KV cache
            if item.identifier in identifiers:
                continue  # the same image earlier in this prompt is encoded in this step
            if cache.check_and_update_cache(request.request_id, item):
                continue  # encoded in an earlier step (or by another request with this image)
            if self.config.disable_chunked_mm_input and num_computed_tokens < item.offset and chunk_end < item.end:
                num_new_tokens = item.offset - num_computed_tokens
                break
            if not cache.can_allocate(item, encoder_budget, num_tokens_to_schedule):
                num_new_tokens = max(item.offset - num_computed_tokens, 0)
                break
            num_tokens_to_schedule += item.length
            encoder_budget -= item.length
            identifiers.add(item.identifier)
            to_encode.append(item)
        return to_encode, num_new_tokens, encoder_budget

    def _free_consumed_encoder_inputs(self, request: Request) -> None:
        """Drop the cache references of images whose placeholders the prefill has passed (called
        while a step's chunk started before the last image's end: after that nothing is held)."""
        computed = request.num_computed_tokens
        for item in request.encoder_inputs:
            if item.end > computed:
                break
            self.encoder_cache_manager.free_encoder_input(request.request_id, item)

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption: free its blocks and put it first in the waiting queue."""
        self.kv_cache_manager.free(request)
        self.encoder_cache_manager.free(request.request_id, request.encoder_inputs)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
