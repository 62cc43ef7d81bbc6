"""Per-request KV block bookkeeping on top of the BlockPool (vLLM's KVCacheManager).

The scheduler asks two questions of it, as in vLLM V1:
`get_computed_blocks(request)` — how much of this prompt is already cached?
`allocate_slots(request, num_new_tokens, new_computed_blocks)` — can this request
get blocks for the tokens it wants to compute this step? (None/False means: preempt
someone or wait).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from vlmserve.sched.kv_cache import BlockHash, BlockPool


class KVRequest(Protocol):
    """What the manager reads and updates on a request."""

    num_computed_tokens: int
    block_ids: list[int]
    block_hashes: list[BlockHash]
    num_cached_blocks: int

    @property
    def num_tokens(self) -> int: ...


class KVCacheManager:
    """Allocates, caches and frees the blocks of requests."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching=enable_caching)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: KVRequest) -> tuple[list[int], int]:
        """Longest cached prefix of the request, as (block ids, tokens).

        Like vLLM, at most `num_tokens - 1` tokens can hit: the last token must be
        recomputed to produce logits for the next one.
        """
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        lookup = self.block_pool.cached_block_hash_to_block.get
        blocks: list[int] = []
        for index in range(min(max_hit_blocks, len(hashes))):
            block_id = lookup(hashes[index])
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request: KVRequest, num_new_tokens: int, new_computed_blocks: Sequence[int] = ()) -> bool:
        """Give the request blocks for `num_new_tokens` more tokens; False if the pool is short."""
        block_size = self.block_size
        pool = self.block_pool
        req_blocks = request.block_ids
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * block_size
        total_tokens = num_computed + num_new_tokens
        num_required = -(-total_tokens // block_size)
        num_to_allocate = num_required - len(req_blocks) - len(new_computed_blocks)
        if num_to_allocate > 0 or new_computed_blocks:
            # Cached blocks that sit in the free queue stop being free once touched.
            ref_cnt = pool.ref_cnt
            evictable_hits = sum(1 for block_id in new_computed_blocks if ref_cnt[block_id] == 0)
            if num_to_allocate > pool.get_num_free_blocks() - evictable_hits:
                return False
            if new_computed_blocks:
                pool.touch(new_computed_blocks)
                req_blocks.extend(new_computed_blocks)
                request.num_cached_blocks = len(req_blocks)
            if num_to_allocate > 0:
                req_blocks.extend(pool.get_new_blocks(num_to_allocate))
        if self.enable_caching:
            num_full = min(total_tokens // block_size, len(request.block_hashes))
            if num_full > request.num_cached_blocks:
                hashes = request.block_hashes
                for index in range(request.num_cached_blocks, num_full):
                    pool.cache_full_block(req_blocks[index], hashes[index])
                request.num_cached_blocks = num_full
        return True

    def free(self, request: KVRequest) -> None:
        """Release the request's blocks, tail first (tail blocks are evicted first)."""
        if request.block_ids:
            self.block_pool.free_blocks(request.block_ids[::-1])
        request.block_ids = []
        request.num_cached_blocks = 0
