"""Pages of KV memory shared by layer groups, with reference counts and content-keyed prefix caching.

Knows nothing of tensors: a page is an integer id into the KV tensors the model runner owns (`PageGeometry`
in kv_cache_manager says which layer reads which page). A group's block is one page, or, for the group
with more layers, a whole chunk of `chunk_pages` consecutive pages (its id: the chunk's first page): the
two layer groups of the model draw their blocks from one memory, in whatever proportion the running
sequences need at the moment, instead of each from a share fixed at start (vLLM's hybrid allocator).

A block that is full and whose content key is known stays findable by that key after it is freed, until the
pool needs its pages for something else (least recently freed first; a one-page block is taken from a chunk
already split before a whole chunk is split). The block's token ids are stored with its key and compared on
every hit, so a key shared by different contents is a miss, never another request's context.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

logger = logging.getLogger(__name__)


class PagePool:
    """`num_pages` pages in chunks of `chunk_pages`. A chunk is whole (free for a chunk-sized block), split (its pages
    serve one-page blocks), or one chunk-sized block in use. A last chunk with fewer pages is split from the start:
    its missing pages count as in use, forever.

    Free chunks, and free pages of split chunks, wait in lines by release time, apart by whether they still hold
    cached content. A block is taken from memory that holds nothing before any cached content is evicted; a page
    from a split chunk before a whole chunk is split (whole chunks are what the blocks of the larger group need)."""

    def __init__(self, num_pages: int, chunk_pages: int = 1):
        self.num_pages = num_pages
        self.chunk_pages = chunk_pages
        num_chunks, partial = divmod(num_pages, chunk_pages)
        self.ref_counts = [0] * num_pages  # per block, at its first page
        # keyed by whether they hold cached content; each line oldest-freed first
        self._free_chunks: dict[bool, OrderedDict[int, None]] = {
            False: OrderedDict((c, None) for c in range(num_chunks)), True: OrderedDict()}
        self._free_pages: dict[bool, OrderedDict[int, None]] = {
            False: OrderedDict((p, None) for p in range(num_pages - partial, num_pages)), True: OrderedDict()}
        # per chunk: its pages in use (all of them for a chunk-sized block)
        self._pages_used = [0] * num_chunks + ([chunk_pages - partial] if partial else [])
        # cached content: block → (group, content key, token bytes), and back
        self._cached: dict[int, tuple[str, bytes, bytes]] = {}
        self._block_of_key: dict[tuple[str, bytes], int] = {}

    @property
    def num_free_pages(self) -> int:
        return self.chunk_pages * self.num_free_chunks + sum(map(len, self._free_pages.values()))

    @property
    def num_free_chunks(self) -> int:
        return sum(map(len, self._free_chunks.values()))

    def can_take(self, chunks: int, pages: int, freed_chunks: int = 0, freed_pages: int = 0) -> bool:
        """Whether `chunks` chunk-sized blocks and `pages` one-page blocks can be allocated, once `freed_chunks` whole
        chunks and `freed_pages` pages of split chunks are released."""
        spare_chunks = self.num_free_chunks + freed_chunks - chunks
        free_pages = sum(map(len, self._free_pages.values())) + freed_pages
        return spare_chunks >= 0 and pages <= free_pages + self.chunk_pages * spare_chunks

    # allocation ----------------------------------------------------------------------------------------

    def allocate(self, whole_chunk: bool) -> int:
        """Take a free block (evicting what its pages cached). Caller checks `can_take` first."""
        lines = [self._free_chunks[False], self._free_chunks[True]]
        if not whole_chunk:  # pages of split chunks before whole chunks of the same kind
            lines = [self._free_pages[False], self._free_chunks[False], self._free_pages[True], self._free_chunks[True]]
        line = next(line for line in lines if line)
        unit, _ = line.popitem(last=False)
        if line is self._free_pages[False] or line is self._free_pages[True]:
            self._forget(unit)
            self._pages_used[unit // self.chunk_pages] += 1
            self.ref_counts[unit] = 1
            return unit
        first = unit * self.chunk_pages
        self._forget(first)
        if whole_chunk:
            for page in range(first + 1, first + self.chunk_pages):
                self._forget(page)
            self._pages_used[unit] = self.chunk_pages
        else:
            self._split(unit, keep=first)
        self.ref_counts[first] = 1
        return first

    def _split(self, chunk: int, keep: int) -> None:
        """A whole free chunk serves one-page blocks from now on, page `keep` taken: its other pages go first in
        their lines (they are as old as the chunk), with what they cached."""
        first = chunk * self.chunk_pages
        for page in range(first + self.chunk_pages - 1, first - 1, -1):
            if page != keep:
                line = self._free_pages[page in self._cached]
                line[page] = None
                line.move_to_end(page, last=False)
        self._pages_used[chunk] = 1

    def release(self, block: int, whole_chunk: bool) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block]:
            return
        chunk = block // self.chunk_pages
        self._pages_used[chunk] = 0 if whole_chunk else self._pages_used[chunk] - 1
        if self._pages_used[chunk]:
            self._free_pages[block in self._cached][block] = None
            return
        first = chunk * self.chunk_pages  # the chunk is whole again: its pages leave the split pages' lines
        for page in range(first, first + self.chunk_pages):
            self._free_pages[page in self._cached].pop(page, None)
        cached = any(page in self._cached for page in range(first, first + self.chunk_pages))
        self._free_chunks[cached][chunk] = None

    def acquire(self, block: int, whole_chunk: bool) -> None:
        """Take a reference on a block found by `lookup` (reviving it if it was free: it holds cached content)."""
        if self.ref_counts[block] == 0:
            chunk = block // self.chunk_pages
            if chunk in self._free_chunks[True]:
                del self._free_chunks[True][chunk]
                if whole_chunk:
                    self._pages_used[chunk] = self.chunk_pages
                else:
                    self._split(chunk, keep=block)
            else:
                del self._free_pages[True][block]
                self._pages_used[chunk] += 1
        self.ref_counts[block] += 1

    # prefix caching --------------------------------------------------------------------------------------

    def register(self, group: str, block: int, key: bytes, token_bytes: bytes) -> None:
        """Record that a full block of `group` holds the tokens `token_bytes` under `key` (first writer wins)."""
        if (group, key) in self._block_of_key or block in self._cached:
            return
        self._cached[block] = (group, key, token_bytes)
        self._block_of_key[group, key] = block

    def lookup(self, group: str, key: bytes, token_bytes: bytes) -> int | None:
        """The block of `group` cached under `key`, if it holds exactly `token_bytes`; None otherwise."""
        block = self._block_of_key.get((group, key))
        if block is None:
            return None
        if self._cached[block][2] != token_bytes:
            logger.warning("prefix cache: block %d has the requested key but other tokens; treated as a miss", block)
            return None
        return block

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def _forget(self, block: int) -> None:
        """Drop what `block` cached: its pages are about to hold something else."""
        old = self._cached.pop(block, None)
        if old is not None and self._block_of_key.get(old[:2]) == block:
            del self._block_of_key[old[:2]]


class KVBlockPool:
    """One group's blocks in a `PagePool` (its own, of one-page chunks, when none is given): a block is a page, or
    a whole chunk where `whole_chunk`."""

    def __init__(self, pages: PagePool | int, whole_chunk: bool = False, group: str = ""):
        self.pages = pages if isinstance(pages, PagePool) else PagePool(pages)
        self.whole_chunk = whole_chunk and self.pages.chunk_pages > 1
        self.group = group
        self.ref_counts = self.pages.ref_counts
        self.num_used = 0
        self.cache_queries = 0
        self.cache_hits = 0

    @property
    def pages_per_block(self) -> int:
        return self.pages.chunk_pages if self.whole_chunk else 1

    @property
    def num_blocks(self) -> int:
        """The most blocks of this group the pages hold (also the id of the pool's spare "null" block in a pool of
        its own: the runner allocates one chunk more, owned by no sequence)."""
        return self.pages.num_pages // self.pages_per_block

    @property
    def num_free(self) -> int:
        """Blocks of this group that could be allocated now, were no other group to take any."""
        return self.pages.num_free_chunks if self.whole_chunk else self.pages.num_free_pages

    def allocate(self) -> int:
        self.num_used += 1
        return self.pages.allocate(self.whole_chunk)

    def release(self, block: int) -> None:
        if self.ref_counts[block] == 1:
            self.num_used -= 1
        self.pages.release(block, self.whole_chunk)

    def acquire_cached(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self.num_used += 1
        self.pages.acquire(block, self.whole_chunk)

    def register(self, block: int, key: bytes, token_bytes: bytes) -> None:
        self.pages.register(self.group, block, key, token_bytes)

    def lookup(self, key: bytes, token_bytes: bytes) -> int | None:
        return self.pages.lookup(self.group, key, token_bytes)

    def is_cached(self, block: int) -> bool:
        return self.pages.is_cached(block)

    def record_lookup(self, queried: int, hit: int) -> None:
        self.cache_queries += queried
        self.cache_hits += hit
