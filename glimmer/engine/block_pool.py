"""A pool of fixed-size KV blocks with reference counts and content-hash prefix caching.

Knows nothing of tensors: a block is an integer id into the KV tensors the model runner owns. A block
that is full and whose content hash is known stays findable by that hash after it is freed, until the
pool needs it for something else (least recently freed first).
"""

from __future__ import annotations

from collections import OrderedDict


class KVBlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # free blocks in eviction order: oldest-freed first; cached ones keep their hash until evicted
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._hash_of_block: dict[int, int] = {}
        self._block_of_hash: dict[int, int] = {}
        self.cache_queries = 0
        self.cache_hits = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        """Take a free block (evicting the hash it cached, if any). Caller checks `num_free` first."""
        block, _ = self._free.popitem(last=False)
        old_hash = self._hash_of_block.pop(block, None)
        if old_hash is not None and self._block_of_hash.get(old_hash) == block:
            del self._block_of_hash[old_hash]
        self.ref_counts[block] = 1
        return block

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free[block] = None

    def register(self, block: int, content_hash: int) -> None:
        """Record that a full block holds the content `content_hash` (first writer wins)."""
        if content_hash in self._block_of_hash or block in self._hash_of_block:
            return
        self._hash_of_block[block] = content_hash
        self._block_of_hash[content_hash] = block

    def lookup(self, content_hash: int) -> int | None:
        return self._block_of_hash.get(content_hash)

    def acquire_cached(self, block: int) -> None:
        """Take a reference on a block found by `lookup` (reviving it if it was free)."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def record_lookup(self, queried: int, hit: int) -> None:
        self.cache_queries += queried
        self.cache_hits += hit
