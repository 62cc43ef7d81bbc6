"""The KV cache as vLLM V1 manages it: a fixed pool of blocks plus a prefix-hash map.

Mirrors `vllm/v1/core/block_pool.py` and `kv_cache_manager.py` at the level that
changes timing: how many blocks a request holds, which full blocks can be reused
by a later request with the same token prefix, and which cached block is evicted
first when a new block is needed.

Rules kept from vLLM:
- A block holds `block_size` tokens. Only *full* blocks are hashed and cached.
- A block's hash chains its parent's hash with the block's token ids (and any
  extra keys, e.g. an image digest is folded into the token ids by the caller),
  so equal hashes mean equal prefixes.
- Freed blocks go to the tail of a free queue but keep their hash: they can be
  "touched" back into use by a prefix hit until they are popped from the head of
  the queue for a new allocation, which evicts their hash (LRU eviction).
- A request frees its blocks in reverse order, so its tail blocks (least likely to
  be shared) are evicted before its head blocks.
- Usage = 1 - free blocks / all blocks (cached-but-free blocks count as free).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BlockHash = int
"""Chained hash of a full block: hash((parent_hash, tuple(token_ids)))."""

ROOT_HASH: BlockHash = 0x5EED
"""Parent hash of a request's first block."""


def hash_block_tokens(parent_hash: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash one full block, chained on its parent (deterministic across processes for ints)."""
    return hash((parent_hash, tuple(token_ids)))


def hash_request_blocks(
    token_ids: Sequence[int], block_size: int, parent_hash: BlockHash = ROOT_HASH, start_block: int = 0
) -> list[BlockHash]:
    """Chained hashes of every full block of `token_ids` from `start_block` on."""
    hashes: list[BlockHash] = []
    num_full = len(token_ids) // block_size
    for block_index in range(start_block, num_full):
        start = block_index * block_size
        parent_hash = hash((parent_hash, tuple(token_ids[start : start + block_size])))
        hashes.append(parent_hash)
    return hashes


class BlockPool:
    """A fixed number of KV blocks with reference counts, a free queue and a hash map."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be at least 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        # Insertion order = eviction order: allocation pops from the head.
        self.free_queue: OrderedDict[int, None] = OrderedDict((block_id, None) for block_id in range(num_blocks))
        self.cached_block_hash_to_block: dict[BlockHash, int] = {}

    # -- queries ---------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_usage(self) -> float:
        """Fraction of blocks held by requests (what vllm:kv_cache_usage_perc reports)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        return self.cached_block_hash_to_block.get(block_hash)

    # -- changes ---------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop blocks from the head of the free queue, evicting any hash they carried."""
        if num_blocks > len(self.free_queue):
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        new_blocks: list[int] = []
        free_queue = self.free_queue
        for _ in range(num_blocks):
            block_id, _unused = free_queue.popitem(last=False)
            self._maybe_evict_cached_block(block_id)
            self.ref_cnt[block_id] = 1
            new_blocks.append(block_id)
        return new_blocks

    def _maybe_evict_cached_block(self, block_id: int) -> None:
        block_hash = self.block_hash[block_id]
        if block_hash is None:
            return
        self.block_hash[block_id] = None
        if self.cached_block_hash_to_block.get(block_hash) == block_id:
            del self.cached_block_hash_to_block[block_hash]

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cached blocks found by a prefix hit (removing free ones from the queue)."""
        for block_id in block_ids:
            if self.ref_cnt[block_id] == 0:
                del self.free_queue[block_id]
            self.ref_cnt[block_id] += 1

    def cache_full_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Record that `block_id` holds the full block with `block_hash`."""
        if not self.enable_caching or self.block_hash[block_id] is not None:
            return
        self.block_hash[block_id] = block_hash
        # Keep the first block cached under a hash; a duplicate is used by its owner only.
        self.cached_block_hash_to_block.setdefault(block_hash, block_id)

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the queue's tail in order."""
        ref_cnt = self.ref_cnt
        free_queue = self.free_queue
        for block_id in ordered_block_ids:
            ref_cnt[block_id] -= 1
            if ref_cnt[block_id] == 0:
                free_queue[block_id] = None

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (vLLM's /reset_prefix_cache)."""
        self.cached_block_hash_to_block.clear()
        for block_id in range(self.num_blocks):
            self.block_hash[block_id] = None
