"""vLLM's frontend stage as a model: image preprocessing in the API server(s), before the scheduler.

In a real vLLM deployment every request first passes through an API server process, where
the images are decoded and resized and the model's HF processor runs; only then does the
engine core's scheduler see the request. vLLM's `--api-server-count` sets how many such
processes there are. Preprocessing is CPU work done inline in that process's event loop
(`AsyncLLM.add_request` → `process_inputs`), so a process handles one request's inputs at a
time: N processes are N servers, and a burst of image requests queues for them (an M/G/N
queue, first come first served). Text-only requests cost nothing here but wait their turn.

vLLM also keeps a multimodal processor cache keyed by image content hash
(`--mm-processor-cache-gb`, default 4 GiB, LRU): a repeated image skips preprocessing, and
here also the vision encoder. It reports `vllm:mm_cache_queries` / `vllm:mm_cache_hits`
(counted in items).

What this model leaves out, on purpose: the tokenizer's own time, network upload, and
vLLM's per-process caches — one cache per replica is kept (as vLLM's `shm` cache type does),
so with `lru` and several API servers a real deployment hits less often than modelled.
A repeat counts as a hit from the moment its first copy was admitted.

Both the sim engine (real time) and the virtual-clock loop the planner uses call
`Frontend.admit` in arrival order; it returns when the request reaches the scheduler.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from vlmserve.errors import UserError

GIB = 1 << 30
PROCESSED_BYTES_PER_PIXEL = 12
"""Size of one processed image in the cache: float32 RGB pixel values, as most HF image
processors return them (an assumption; a model that tiles or duplicates frames stores more)."""
DEFAULT_PREPROCESS_MS_PER_IMAGE = 2.0
DEFAULT_PREPROCESS_MS_PER_MEGAPIXEL = 20.0
"""Defaults: decoding, resizing and normalising a 1 MP JPEG takes roughly 10–30 ms on one
CPU core with PIL + an HF image processor (hand-set, not calibrated)."""
DEFAULT_MM_PROCESSOR_CACHE_GB = 4.0
"""vLLM's own default for --mm-processor-cache-gb."""
MAX_API_SERVER_COUNT = 1024
"""More frontend processes than any host runs; the bound keeps a typo from allocating gigabytes."""
MAX_PREPROCESS_MS = 3_600_000.0
"""An hour per image (or per megapixel): anything above is a typo, not a model."""


@dataclass(frozen=True)
class ImageItem:
    """One image of a request, as the frontend sees it."""

    digest: int
    """Content hash: equal images, equal digest (the cache key)."""
    pixels: int
    """Width × height of the image as sent (decode and resize cost grow with it)."""
    tokens: int
    """Vision tokens the image becomes (the encoder's work it saves on a cache hit)."""


@dataclass(frozen=True)
class FrontendConfig:
    """How the API server stage is priced and sized; flag names follow vLLM where vLLM has one."""

    api_server_count: int = 1
    preprocess_ms_per_image: float = DEFAULT_PREPROCESS_MS_PER_IMAGE
    preprocess_ms_per_megapixel: float = DEFAULT_PREPROCESS_MS_PER_MEGAPIXEL
    mm_processor_cache_gb: float = DEFAULT_MM_PROCESSOR_CACHE_GB

    def validate(self) -> None:
        """One-line UserErrors naming the flag; zero costs are allowed (no preprocessing time)."""
        if self.api_server_count < 1:
            raise UserError(f"--api-server-count must be at least 1 (frontend processes), got {self.api_server_count}")
        if self.api_server_count > MAX_API_SERVER_COUNT:
            raise UserError(f"--api-server-count must be at most {MAX_API_SERVER_COUNT}, got {self.api_server_count}")
        for flag, value in (
            ("--preprocess-ms-per-image", self.preprocess_ms_per_image),
            ("--preprocess-ms-per-megapixel", self.preprocess_ms_per_megapixel),
            ("--mm-processor-cache-gb", self.mm_processor_cache_gb),
        ):
            if not math.isfinite(value) or value < 0:
                raise UserError(f"{flag} must be a finite number of at least 0, got {value}")
            if flag.startswith("--preprocess") and value > MAX_PREPROCESS_MS:
                raise UserError(f"{flag} must be at most {MAX_PREPROCESS_MS:.0f} (an hour), got {value:g}")

    def image_preprocess_s(self, pixels: int) -> float:
        """Seconds one API server spends decoding, resizing and processing one image."""
        return (self.preprocess_ms_per_image + self.preprocess_ms_per_megapixel * pixels / 1e6) / 1000.0

    @property
    def cache_bytes(self) -> int:
        return int(self.mm_processor_cache_gb * GIB)


class MMProcessorCache:
    """LRU of image digests, sized in bytes of processed images (vLLM's `lru` processor cache)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.queries = 0
        self.hits = 0
        self._entries: OrderedDict[int, int] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def lookup(self, item: ImageItem) -> bool:
        """Whether the image is cached; a miss is inserted (evicting the least recently used)."""
        if not self.enabled:
            return False
        self.queries += 1
        entries = self._entries
        if item.digest in entries:
            entries.move_to_end(item.digest)
            self.hits += 1
            return True
        size = item.pixels * PROCESSED_BYTES_PER_PIXEL
        if size > self.capacity_bytes:
            return False  # vLLM serves an item larger than the whole cache uncached
        entries[item.digest] = size
        self.used_bytes += size
        while self.used_bytes > self.capacity_bytes:
            _digest, evicted = entries.popitem(last=False)
            self.used_bytes -= evicted
        return False

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class FrontendPass:
    """What the frontend did with one request."""

    arrival_s: float
    start_s: float
    """When an API server took it (arrival, or later when all were busy)."""
    ready_s: float
    """When it reaches the scheduler: the end of its preprocessing."""
    images: int
    cache_hits: int
    cached_image_tokens: int

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def preprocess_s(self) -> float:
        return self.ready_s - self.start_s


class Frontend:
    """N API servers, first come first served, and one processor cache (see the module docstring)."""

    def __init__(self, config: FrontendConfig) -> None:
        config.validate()
        self.config = config
        self.cache = MMProcessorCache(config.cache_bytes)
        self._free_at = [0.0] * config.api_server_count
        self.busy_s = 0.0
        self.requests = 0
        self.image_requests = 0

    def admit(self, arrival_s: float, images: Sequence[ImageItem]) -> FrontendPass:
        """Queue one request (calls come in arrival order); say when it reaches the scheduler."""
        free_s = heapq.heappop(self._free_at)
        start_s = max(arrival_s, free_s)
        service_s = 0.0
        hits = 0
        cached_tokens = 0
        for item in images:
            if self.cache.lookup(item):
                hits += 1
                cached_tokens += item.tokens
            else:
                service_s += self.config.image_preprocess_s(item.pixels)
        ready_s = start_s + service_s
        heapq.heappush(self._free_at, ready_s)
        self.busy_s += service_s
        self.requests += 1
        self.image_requests += 1 if images else 0
        return FrontendPass(arrival_s, start_s, ready_s, len(images), hits, cached_tokens)


def frontend_utilisation(image_request_rate: float, preprocess_s_per_request: float, api_server_count: int) -> float:
    """Offered load per API server (ρ = λ·S / N): at 1 the queue grows without bound."""
    return image_request_rate * preprocess_s_per_request / max(api_server_count, 1)
