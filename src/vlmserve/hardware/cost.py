"""Roofline pricing of one engine step: a `StepCostModel` for a real model on a real GPU.

A step's time is the larger of its compute time and its memory time (the roofline),
plus tensor-parallel all-reduces and a fixed per-step overhead:

- memory: weights the batch touches (MoE: only the experts its tokens route to) plus the
  KV cache attention reads and writes, at `bandwidth` × peak;
- compute: 2·active params per token, attention FLOPs that grow with context, the LM head
  for sampled tokens and the vision encoder for new image tokens, at `compute` × peak;
- communication: two all-reduces of the batch's hidden states per layer when TP > 1;
- overhead: the engine's CPU work per step (scheduling, input preparation, sampling
  bookkeeping), fixed plus per sequence. It adds to the GPU time, except under vLLM's
  --async-scheduling, where it runs while the GPU executes the previous step, so a step
  takes the longer of the two.

The per-step inputs come from the shared scheduler's `StepContents`, so the planner and
the sim engine price the very same schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmserve.hardware.calibration import Efficiency
from vlmserve.hardware.gpus import GPU, allreduce_time_s
from vlmserve.hardware.models import ModelCost
from vlmserve.sched.step_cost import StepContents

ACTIVATION_BYTES = 2.0
"""Hidden states travel between GPUs in BF16."""


@dataclass(frozen=True)
class StepBreakdown:
    """The parts of one step's time, for `--explain` and for tests."""

    compute_s: float
    memory_s: float
    communication_s: float
    overhead_s: float
    overlapped: bool = False
    """True under async scheduling: the CPU overhead hides behind the GPU work."""
    frontend_s: float = 0.0
    """The API server's CPU for this step's streams and new requests (`frontend_step_s`): its own
    process, so the step takes the longer of it and the engine."""

    @property
    def gpu_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.communication_s

    @property
    def total_s(self) -> float:
        engine = max(self.gpu_s, self.overhead_s) if self.overlapped else self.gpu_s + self.overhead_s
        return max(engine, self.frontend_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def frontend_step_s(efficiency: Efficiency, step: StepContents, api_servers: int = 1) -> float:
    """Seconds of API-server CPU one engine step hands it, spread over `api_servers` processes.

    Every sequence in the step is counted as streaming a token (a prefill chunk that does not end
    its prompt streams none: a slight over-count for long chunked prompts, where GPU time dominates),
    and every prefill sequence as a request the API server admitted (likewise over-counted for a
    prompt spread over several chunks). vLLM's engine runs ahead of a slower API server and its
    output queue grows; the client sees tokens at the API server's pace, which is what taking the
    longer of the two per step reproduces in steady state.
    """
    if efficiency.frontend_token_s <= 0 and efficiency.frontend_request_s <= 0:
        return 0.0
    work = (
        efficiency.frontend_token_s * (step.prefill_seqs + step.decode_seqs) + efficiency.frontend_request_s * step.prefill_seqs
    )
    return work / max(api_servers, 1)


@dataclass
class RooflineStepCost:
    """Prices StepContents for `model` on `tp` × `gpu` with calibrated efficiencies."""

    model: ModelCost
    gpu: GPU
    tp: int
    weight_dtype: str
    kv_dtype: str
    efficiency: Efficiency
    async_scheduling: bool = False
    api_servers: int = 1
    """vLLM's --api-server-count: the processes that share `frontend_step_s`."""
    _weight_bytes_cache: dict[int, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        eff = self.efficiency
        self._bytes_per_s = self.gpu.bandwidth_bytes_s * max(eff.bandwidth, 1e-6) * self.tp
        self._flops_per_s = self.gpu.peak_flops(self.weight_dtype) * max(eff.compute, 1e-6) * self.tp
        self._kv_bytes_per_token = self.model.kv_bytes_per_token(self.kv_dtype)
        expert_flops = self.model.routed_expert_flops_per_token()
        # Expert FLOPs count as if they ran at the dense rate times moe_efficiency.
        self._linear_flops = self.model.linear_flops_per_token() - expert_flops + expert_flops / max(eff.moe_efficiency, 1e-6)
        self._lm_head_flops = self.model.lm_head_flops_per_sampled_token()
        vision = self.model.vision
        self._vision_flops = vision.flops_per_image_token if vision else 0.0
        self._vision_bytes = 2.0 * vision.params if vision else 0.0

    def weight_bytes(self, batch_tokens: int) -> float:
        """Effective weight bytes a forward pass over `batch_tokens` streams (cached per batch size)."""
        cached = self._weight_bytes_cache.get(batch_tokens)
        if cached is None:
            spread = self.efficiency.moe_expert_spread
            total = self.model.step_weight_bytes(batch_tokens, self.weight_dtype, spread)
            experts = self.model.step_expert_bytes(batch_tokens, self.weight_dtype, spread)
            # Expert bytes count as if streamed at the dense rate times moe_efficiency.
            cached = total - experts + experts / max(self.efficiency.moe_efficiency, 1e-6)
            self._weight_bytes_cache[batch_tokens] = cached
        return cached

    def breakdown(self, step: StepContents) -> StepBreakdown:
        """Compute, memory, communication and overhead time of one step."""
        eff = self.efficiency
        seqs = step.prefill_seqs + step.decode_seqs
        tokens = step.batch_tokens
        overhead = eff.step_overhead_s + eff.per_seq_overhead_s * seqs
        frontend = frontend_step_s(eff, step, self.api_servers)
        if tokens <= 0 and step.image_tokens <= 0:
            return StepBreakdown(0.0, 0.0, 0.0, overhead, self.async_scheduling, frontend)
        model = self.model
        mean_context = step.kv_tokens_read / seqs if seqs else 0.0

        kv_read = seqs * model.kv_bytes_for_context(mean_context, self.kv_dtype)
        kv_write = tokens * self._kv_bytes_per_token
        memory_bytes = self.weight_bytes(tokens) + kv_read + kv_write
        if step.image_tokens:
            memory_bytes += self._vision_bytes

        flops = tokens * self._linear_flops + seqs * self._lm_head_flops
        if step.decode_seqs:
            flops += step.decode_seqs * model.attention_flops_per_query(mean_context, phase="decode")
        if step.prefill_tokens:
            chunk = step.prefill_tokens / max(step.prefill_seqs, 1)
            # A chunk's queries see, on average, the context before it plus half the chunk.
            query_context = max(mean_context - chunk / 2.0, chunk / 2.0)
            flops += step.prefill_tokens * model.attention_flops_per_query(query_context)
        flops += step.image_tokens * self._vision_flops

        communication = 0.0
        if self.tp > 1 and tokens > 0:
            message = tokens * model.hidden_size * ACTIVATION_BYTES
            per_call = allreduce_time_s(message, self.tp, self.gpu, eff.interconnect, eff.allreduce_latency_s)
            communication = 2 * model.num_layers * per_call
        return StepBreakdown(
            flops / self._flops_per_s, memory_bytes / self._bytes_per_s, communication, overhead, self.async_scheduling, frontend
        )

    def step_time_s(self, step: StepContents) -> float:
        """Seconds the step takes: max(compute, memory) + TP communication, plus (or, async, overlapping) overhead."""
        return self.breakdown(step).total_s
