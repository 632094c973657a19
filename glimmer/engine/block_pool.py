"""A pool of fixed-size KV blocks with reference counts and content-keyed prefix caching.

Knows nothing of tensors: a block is an integer id into the KV tensors the model runner owns. A block
that is full and whose content key is known stays findable by that key after it is freed, until the
pool needs it for something else (least recently freed first). The block's token ids are stored with its
key and compared on every hit, so a key shared by different contents is a miss, never another request's
context.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

logger = logging.getLogger(__name__)


class KVBlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # free blocks in eviction order: oldest-freed first; cached ones keep their key until evicted
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._cached: dict[int, tuple[bytes, bytes]] = {}  # block → (content key, token bytes)
        self._block_of_key: dict[bytes, int] = {}
        self.cache_queries = 0
        self.cache_hits = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        """Take a free block (evicting the content it cached, if any). Caller checks `num_free` first."""
        block, _ = self._free.popitem(last=False)
        old = self._cached.pop(block, None)
        if old is not None and self._block_of_key.get(old[0]) == block:
            del self._block_of_key[old[0]]
        self.ref_counts[block] = 1
        return block

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free[block] = None

    def register(self, block: int, key: bytes, token_bytes: bytes) -> None:
        """Record that a full block holds the tokens `token_bytes` under `key` (first writer wins)."""
        if key in self._block_of_key or block in self._cached:
            return
        self._cached[block] = (key, token_bytes)
        self._block_of_key[key] = block

    def lookup(self, key: bytes, token_bytes: bytes) -> int | None:
        """The block cached under `key`, if it holds exactly `token_bytes`; None otherwise."""
        block = self._block_of_key.get(key)
        if block is None:
            return None
        if self._cached[block][1] != token_bytes:
            logger.warning("prefix cache: block %d has the requested key but other tokens; treated as a miss", block)
            return None
        return block

    def acquire_cached(self, block: int) -> None:
        """Take a reference on a block found by `lookup` (reviving it if it was free)."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def record_lookup(self, queried: int, hit: int) -> None:
        self.cache_queries += queried
        self.cache_hits += hit
