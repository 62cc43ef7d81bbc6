"""The encoder cache of vLLM V1 (`vllm/v1/core/encoder_cache_manager.py`), sized in encoder tokens.

A multimodal request's images sit in its prompt as placeholder ranges. The scheduler runs the
vision encoder on an image in the step whose prefill chunk first reaches the image, and the
encoder output waits in this cache until the prefill has consumed all of the image's
placeholder tokens. The cache is what bounds how far ahead images can be encoded: vLLM sizes it
with `encoder_cache_size` (default: `max_num_batched_tokens`), in tokens of encoder output.

Rules kept from vLLM:
- Entries are keyed by the image's content hash, so two requests carrying the same image share
  one entry; a request referencing an entry that is already there does not encode it again.
- A request's reference is dropped once its prefill has passed the image, or when it finishes,
  is aborted or preempted. An entry with no references is *freeable*: it stays (and can still be
  hit) until its room is needed, then the oldest freeable entries are evicted first.
- `can_allocate` fails when the image exceeds what is left of the step's encoder compute budget,
  or when free plus freeable room cannot hold it together with the images already scheduled in
  this step for the same request.
Not modelled: break tokens inside a placeholder range (every placeholder token is one embedding).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple


class PlaceholderRange(NamedTuple):
    """Where one image's placeholder tokens sit in a prompt (vLLM's `PlaceholderRange`)."""

    offset: int
    length: int


@dataclass(frozen=True)
class EncoderInput:
    """One image a request needs encoded: its placeholder range and its cache key."""

    offset: int
    length: int
    identifier: Hashable
    """The image's content hash when known (shared across requests), else a per-request key."""

    @property
    def end(self) -> int:
        return self.offset + self.length


class EncoderCacheManager:
    """Which encoder outputs are held, by which requests, and how much room is left (in tokens)."""

    def __init__(self, cache_size: int) -> None:
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.num_freeable_slots = cache_size
        self.cached: dict[Hashable, set[str]] = {}
        """Identifier → ids of the requests that reference the entry (empty set: freeable)."""
        self.freeable: OrderedDict[Hashable, int] = OrderedDict()
        """Unreferenced entries and their sizes, oldest first (the eviction order)."""

    def grow(self, cache_size: int) -> None:
        """Raise the size (vLLM raises it to the largest item at start-up so one image always fits)."""
        extra = cache_size - self.cache_size
        if extra > 0:
            self.cache_size = cache_size
            self.num_free_slots += extra
            self.num_freeable_slots += extra

    def check_and_update_cache(self, request_id: str, item: EncoderInput) -> bool:
        """Whether the item's output is already held; if so the request takes a reference to it."""
        holders = self.cached.get(item.identifier)
        if holders is None:
            return False
        if not holders:
            self.num_freeable_slots -= self.freeable.pop(item.identifier)
        holders.add(request_id)
        return True

    def can_allocate(self, item: EncoderInput, encoder_compute_budget: int, num_tokens_to_schedule: int) -> bool:
        """Whether the item can be encoded now, evicting freeable entries if that makes room.

        `num_tokens_to_schedule`: encoder tokens already picked for this request in this step.
        """
        num_tokens = item.length
        if num_tokens > encoder_compute_budget:
            return False
        num_tokens += num_tokens_to_schedule
        if num_tokens <= self.num_free_slots:
            return True
        if num_tokens > self.num_freeable_slots:
            return False
        while num_tokens > self.num_free_slots:
            identifier, size = self.freeable.popitem(last=False)
            del self.cached[identifier]
            self.num_free_slots += size
        return True

    def allocate(self, request_id: str, item: EncoderInput) -> None:
        """Reserve room for the item's output (after `can_allocate` said yes)."""
        self.cached.setdefault(item.identifier, set()).add(request_id)
        self.num_free_slots -= item.length
        self.num_freeable_slots -= item.length

    def free_encoder_input(self, request_id: str, item: EncoderInput) -> None:
        """Drop the request's reference; the entry becomes freeable when nobody else holds it."""
        holders = self.cached.get(item.identifier)
        if not holders or request_id not in holders:
            return
        holders.discard(request_id)
        if not holders:
            self.freeable[item.identifier] = item.length
            self.num_freeable_slots += item.length

    def free(self, request_id: str, items: tuple[EncoderInput, ...]) -> None:
        """Drop every reference the request holds (finished, aborted or preempted)."""
        for item in items:
            self.free_encoder_input(request_id, item)

    @property
    def num_used_slots(self) -> int:
        """Tokens held by referenced entries (what cannot be reclaimed now)."""
        return self.cache_size - self.num_freeable_slots


def placeholder_ranges(
    num_prompt_tokens: int, images: int, image_tokens: int, positions: tuple[PlaceholderRange, ...] | tuple[tuple[int, int], ...]
) -> tuple[PlaceholderRange, ...]:
    """Each image's placeholder range, in the order of the request's images.

    With `positions` each image's range is given (the sim engine knows where its placeholders
    are). Without, `images` images share `image_tokens` evenly and sit back to back at the start
    of the prompt, as a chat template puts a user turn's images before its text.
    """
    if positions:
        return tuple(PlaceholderRange(int(offset), int(length)) for offset, length in positions)
    if images <= 0 or image_tokens <= 0:
        return ()
    base, extra = divmod(min(image_tokens, num_prompt_tokens), images)
    ranges, offset = [], 0
    for index in range(images):
        length = base + (1 if index < extra else 0)
        ranges.append(PlaceholderRange(offset, length))
        offset += length
    return tuple(ranges)


def layout_encoder_inputs(
    request_id: str,
    num_prompt_tokens: int,
    images: int,
    image_tokens: int,
    positions: tuple[PlaceholderRange, ...] | tuple[tuple[int, int], ...],
    digests: tuple[int, ...],
) -> tuple[EncoderInput, ...]:
    """The images a request needs encoded, in prompt order (see `placeholder_ranges`).

    `digests` (aligned with the images when given) key the cache so equal images share an entry;
    without them each image is its own.
    """
    ranges = placeholder_ranges(num_prompt_tokens, images, image_tokens, positions)
    keyed = len(digests) == len(ranges)
    inputs = [
        EncoderInput(offset, length, ("image", digests[index]) if keyed else (request_id, index))
        for index, (offset, length) in enumerate(ranges)
        if length > 0
    ]
    return tuple(sorted(inputs, key=lambda item: item.offset))


def keep_fresh_images(
    positions: tuple[PlaceholderRange, ...], image_items: tuple[tuple[int, int], ...], fresh: tuple[bool, ...]
) -> tuple[tuple[PlaceholderRange, ...], tuple[tuple[int, int], ...]]:
    """The placeholder ranges and items of the images that missed the frontend's multimodal cache.

    The project's frontend model lets a cached image skip the encoder as well as the processor
    (sched.frontend), so only the missed ones reach the encoder budget; the cached ones' placeholder
    tokens are still prefilled.
    """
    kept = [index for index, missed in enumerate(fresh) if missed and positions[index].length > 0]
    return tuple(positions[index] for index in kept), tuple(image_items[index] for index in kept)


def check_positions(positions: tuple[tuple[int, int], ...], num_prompt_tokens: int) -> None:
    """Raise ValueError unless the ranges lie inside the prompt, in order, without overlapping."""
    previous_end = 0
    for offset, length in positions:
        if length < 0 or offset < previous_end or offset + length > num_prompt_tokens:
            raise ValueError(
                f"image placeholder range (offset {offset}, length {length}) must be in order, "
                f"not overlap the previous one and lie inside the {num_prompt_tokens}-token prompt"
            )
        previous_end = offset + length
