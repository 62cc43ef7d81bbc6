"""vLLM's LoRA adapter rules, for the scheduler model: batch slots, the host-memory adapter cache, their costs.

- At most `max_loras` distinct adapters run in one step. A waiting request whose adapter would be
  one too many is skipped (and stays at its place in the queue) while later requests whose adapters
  fit are admitted, as vLLM V1's scheduler does; so with more hot adapters than slots a request can
  wait while its slot-holders keep running.
- Adapters live in an LRU of `max_cpu_loras` in host memory; a step that schedules an adapter not
  there first loads it (`load_s` each: reading the weights), and evicts the least recently used.
- Each distinct adapter in a step adds `per_adapter_step_s` (the LoRA kernels run per adapter group).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraConfig:
    """An engine's adapter limits (vLLM's --max-loras, --max-cpu-loras) and the model's adapter costs."""

    max_loras: int = 1
    max_cpu_loras: int | None = None
    """None: max_loras, as vLLM."""
    load_s: float = 0.0
    per_adapter_step_s: float = 0.0

    def validate(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")
        if self.load_s < 0 or self.per_adapter_step_s < 0:
            raise ValueError("adapter load and step costs must be 0 or more seconds")


class LoraSlots:
    """One engine's adapter state across steps: the slots of the step being built, and the adapter cache."""

    def __init__(self, config: LoraConfig) -> None:
        config.validate()
        self.config = config
        self.capacity = config.max_cpu_loras or config.max_loras
        self.cached: OrderedDict[str, None] = OrderedDict()
        self.active: set[str] = set()
        self.loads_total = 0

    def begin_step(self, running: Iterable[str | None]) -> None:
        """The adapters the running requests scheduled this step already hold slots for."""
        self.active = {lora for lora in running if lora is not None}

    def admits(self, lora: str | None) -> bool:
        """May a waiting request with this adapter join the step (a base-model request always may)?"""
        return lora is None or lora in self.active or len(self.active) < self.config.max_loras

    def admit(self, lora: str | None) -> None:
        if lora is not None:
            self.active.add(lora)

    def step_extra_s(self) -> float:
        """What the step's adapters add to its time: loads of those not cached, and the per-adapter kernels."""
        loads = 0
        for lora in self.active:
            if lora in self.cached:
                self.cached.move_to_end(lora)
                continue
            loads += 1
            self.cached[lora] = None
            while len(self.cached) > self.capacity:
                self.cached.popitem(last=False)
        self.loads_total += loads
        return loads * self.config.load_s + len(self.active) * self.config.per_adapter_step_s
