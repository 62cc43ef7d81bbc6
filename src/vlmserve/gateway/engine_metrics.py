"""Read the few load figures the engine-aware policy needs from an engine's Prometheus text.

vLLM (and the sim engine) expose hundreds of lines; a full Prometheus parse of every replica
each second would stall the event loop the streams run on, so only the wanted lines are split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vlmserve import vllm_names

WAITING = vllm_names.NUM_REQUESTS_WAITING
RUNNING = vllm_names.NUM_REQUESTS_RUNNING
KV_USAGE_NAMES = (vllm_names.KV_CACHE_USAGE, vllm_names.KV_CACHE_USAGE_LEGACY)
LORA_INFO = vllm_names.LORA_REQUESTS_INFO
"""vLLM's LoRA gauge: labels max_lora and the adapters with requests running / waiting; its value is the time
it was set, and older label sets stay listed, so the newest sample is the current one."""
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class EngineLoad:
    """One scrape of an engine: queue depth, batch size and KV-cache fill (0..1)."""

    waiting: float
    running: float
    kv_usage: float
    scraped_at: float
    adapters: frozenset[str] = frozenset()  # LoRA adapters with requests running or waiting (LORA_INFO)
    max_loras: int | None = None  # adapters one batch may hold (LORA_INFO's max_lora); None: LoRA off or unknown


def _sample_value(line: str) -> float:
    try:
        return float(line.rsplit(" ", 1)[1])
    except (IndexError, ValueError):
        return 0.0


def parse_engine_load(text: str, scraped_at: float) -> EngineLoad:
    """Sum each wanted gauge over its label sets (one engine may report several)."""
    waiting = running = 0.0
    kv_values: list[float] = []
    lora_line, lora_time = "", -1.0
    for line in text.splitlines():
        if not line.startswith(vllm_names.PREFIX):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == WAITING:
            waiting += _sample_value(line)
        elif name == RUNNING:
            running += _sample_value(line)
        elif name in KV_USAGE_NAMES:
            kv_values.append(_sample_value(line))
        elif name == LORA_INFO and _sample_value(line) > lora_time:
            lora_line, lora_time = line, _sample_value(line)
    kv_usage = max(kv_values) if kv_values else 0.0
    labels = dict(_LABEL.findall(lora_line.split("}", 1)[0])) if lora_line else {}
    adapters = frozenset(
        name for key in ("running_lora_adapters", "waiting_lora_adapters") for name in labels.get(key, "").split(",") if name
    )
    max_lora = labels.get("max_lora", "")
    return EngineLoad(
        waiting=waiting,
        running=running,
        kv_usage=kv_usage,
        scraped_at=scraped_at,
        adapters=adapters,
        max_loras=int(max_lora) if max_lora.isdigit() else None,
    )
