"""vLLM's frontend as a queue: image preprocessing in the API server processes, and the multimodal cache.

Before the scheduler sees a request with images, one of vLLM's API server processes
(`--api-server-count`, default 1) downloads and decodes each image and runs the model's processor
on it. That work is CPU-bound and serial per process, so under an image-heavy load the frontend,
not the GPU, can be the bottleneck: requests wait for a free API server while the engine's own
queue stays short. vLLM also keeps a multimodal processor cache keyed by the image's content: a
repeated image skips the processor here and the vision encoder in the engine.

The model here, used by both the HTTP sim engine and the planner's virtual clock:
- A request's preprocessing time is the sum over its images not in the cache of
  `per_image_ms` + `per_megapixel_ms` × megapixels. Text-only requests (and requests whose images
  are all cached) pass straight through: tokenisation is not priced.
- `api_server_count` identical servers take requests first come, first served (an M/G/N queue):
  a request starts on the server that frees first and holds it for its whole preprocessing.
- The cache is an LRU of `mm_cache_items` image digests (vLLM sizes its cache in GiB, with
  `--mm-processor-cache-gb`; items are simpler to reason about here). An image enters it when its
  request is admitted, so a repeat arriving while the first is still being processed counts as a
  hit (vLLM would process it twice): the model is slightly optimistic for bursts of one image.
Not modelled: image download time (remote URLs), per-process memory, video and audio.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from vlmserve.sched.encoder_cache_manager import keep_fresh_images, placeholder_ranges
from vlmserve.sched.scheduler import SimRequest

MAX_API_SERVER_COUNT = 1024
"""More frontend processes than any host runs: the bound keeps a typo from allocating gigabytes."""
MAX_PREPROCESS_MS = 3_600_000.0
"""An hour per image (or per megapixel): above that a value is a typo, not a model."""
MAX_MM_CACHE_ITEMS = 10_000_000

ImageItem = tuple[int, int]
"""(content digest, pixels) of one image in a request."""


@dataclass(frozen=True)
class FrontendConfig:
    """How long images take in the API server, how many servers there are, how big the cache is."""

    api_server_count: int = 1
    per_image_ms: float = 0.0
    per_megapixel_ms: float = 0.0
    mm_cache_items: int = 1024

    @property
    def prices_images(self) -> bool:
        return self.per_image_ms > 0 or self.per_megapixel_ms > 0

    def image_s(self, pixels: int) -> float:
        """Preprocessing time of one image not in the cache."""
        return (self.per_image_ms + self.per_megapixel_ms * pixels / 1e6) / 1000.0

    def validate(self) -> list[str]:
        """Problems, each one line naming the flag (empty when fine)."""
        problems = []
        if self.api_server_count < 1:
            problems.append(f"--api-server-count must be at least 1, got {self.api_server_count}")
        elif self.api_server_count > MAX_API_SERVER_COUNT:
            problems.append(f"--api-server-count must be at most {MAX_API_SERVER_COUNT}, got {self.api_server_count}")
        if self.per_image_ms < 0 or self.per_megapixel_ms < 0:
            problems.append("--mm-preprocess-ms-per-image and --mm-preprocess-ms-per-megapixel must not be negative")
        for flag, value in (
            ("--mm-preprocess-ms-per-image", self.per_image_ms),
            ("--mm-preprocess-ms-per-megapixel", self.per_megapixel_ms),
        ):
            if not math.isfinite(value):  # NaN slips past `< 0` and would poison every clock it touches
                problems.append(f"{flag} must be a finite number of milliseconds, got {value}")
            elif value > MAX_PREPROCESS_MS:
                problems.append(f"{flag} must be at most {MAX_PREPROCESS_MS:.0f} (an hour), got {value:g}")
        if self.mm_cache_items < 0:
            problems.append(f"--mm-cache-items must be 0 (no cache) or more, got {self.mm_cache_items}")
        elif self.mm_cache_items > MAX_MM_CACHE_ITEMS:
            problems.append(f"--mm-cache-items must be at most {MAX_MM_CACHE_ITEMS}, got {self.mm_cache_items}")
        return problems


@dataclass(frozen=True)
class FrontendVisit:
    """What the frontend did with one request."""

    arrival_s: float
    start_s: float  # a server took it (arrival_s when it needed none)
    ready_s: float  # handed to the scheduler
    queries: int  # images looked up in the cache
    hits: int  # of which were cached
    fresh_images: int  # processed here, and to be encoded by the engine
    fresh: tuple[bool, ...] = ()
    """Per image of the request, in order: True when it missed the cache (the engine encodes it)."""

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def preprocess_s(self) -> float:
        return self.ready_s - self.start_s


class Frontend:
    """One replica's API servers and multimodal cache, on any clock (virtual or real seconds)."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self._free_at = [0.0] * config.api_server_count  # a heap of when each server frees
        self._cache: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0
        self.busy_s = 0.0

    def _lookup(self, digest: int) -> bool:
        if self.config.mm_cache_items <= 0:
            return False
        if digest in self._cache:
            self._cache.move_to_end(digest)
            return True
        self._cache[digest] = None
        if len(self._cache) > self.config.mm_cache_items:
            self._cache.popitem(last=False)
        return False

    def admit(self, arrival_s: float, images: Sequence[ImageItem]) -> FrontendVisit:
        """Run one request (arriving at `arrival_s`) through the frontend; when is it ready?"""
        fresh = tuple(not self._lookup(digest) for digest, _pixels in images)
        fresh_pixels = [pixels for (_digest, pixels), missed in zip(images, fresh) if missed]
        hits = len(images) - len(fresh_pixels)
        self.queries += len(images)
        self.hits += hits
        cost = sum(self.config.image_s(pixels) for pixels in fresh_pixels)
        if cost <= 0:
            return FrontendVisit(arrival_s, arrival_s, arrival_s, len(images), hits, len(fresh_pixels), fresh)
        start = max(arrival_s, self._free_at[0])
        heapq.heapreplace(self._free_at, start + cost)
        self.busy_s += cost
        return FrontendVisit(arrival_s, start, start + cost, len(images), hits, len(fresh_pixels), fresh)


def only_fresh_images(request: SimRequest, fresh: Sequence[bool]) -> SimRequest:
    """The request as the engine sees it after the frontend: only the images that missed the
    multimodal cache are left to encode (a hit skips the encoder too; see the module's notes).

    Each kept image keeps its placeholder range, so the engine encodes it when the prefill
    reaches it; the cached images' placeholder tokens are still prefilled.
    """
    if all(fresh):
        return request
    ranges = placeholder_ranges(len(request.prompt_token_ids), request.images, request.image_tokens, request.mm_positions)
    if len(ranges) != len(fresh) or len(request.image_items) != len(fresh):
        # no per-image layout to filter (e.g. an image priced at 0 tokens): scale the totals
        kept = [item for item, missed in zip(request.image_items, fresh) if missed]
        return replace(
            request,
            images=len(kept),
            mm_positions=(),
            image_items=tuple(kept),
            image_tokens=round(request.image_tokens * len(kept) / len(fresh)),
        )
    positions, items = keep_fresh_images(ranges, request.image_items, tuple(fresh))
    return replace(
        request,
        images=len(positions),
        image_tokens=sum(length for _offset, length in positions),
        mm_positions=positions,
        image_items=items,
    )
