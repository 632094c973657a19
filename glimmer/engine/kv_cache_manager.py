"""Block accounting for the KV layer groups (architecture.md §2.6, §10).

Full-attention layers keep a block for every position of a sequence. Sliding-window layers only read
the last W positions, so blocks entirely before the window of the next query are released as soon as
the sequence moves past them: a long conversation costs what the full-attention layers cost.

Both groups take their blocks from one pool of pages (`PageGeometry`, block_pool.py): however the running
sequences divide between short ones (where a sliding block is needed for every full one) and long ones
(where the full group holds nearly everything), no memory sits reserved for the group that does not need it.

Prefix caching keys each full block by its content (cache_keys: the parent block's key — for the first
block, the request's cache salt — its token ids and the media in it). A new sequence reuses the longest
run of cached blocks that covers, in every group, what its first uncomputed position needs: all earlier
blocks for the full group, and the last W positions for the sliding group.

With speculative decoding a third group, in a pool of its own, holds the DFlash drafter's context keys and
values, one entry per committed position like the target's; its queries see keys up to `draft_window` positions
back (None: all). A hit needs the drafter's blocks only from the window before the sequence's last token, where its
first proposal reads: the drafter writes the positions after the hit again from the target's hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from glimmer.engine.block_pool import KVBlockPool, PagePool
from glimmer.engine.cache_keys import block_key, root_key, token_bytes
from glimmer.engine.sequence import Sequence
from glimmer.model.context import FULL, SLIDING

if TYPE_CHECKING:
    from glimmer.checkpoint.config import TextConfig

DRAFT = "draft"


def attention_groups(text: TextConfig) -> list[str]:
    """The KV groups the target model's layers fill: FULL and SLIDING, each where some layer has it."""
    return [g for g, layers in ((FULL, text.full_attention_layers), (SLIDING, text.sliding_attention_layers))
            if layers]


@dataclass(frozen=True)
class PageGeometry:
    """How the target's layer groups share KV pages. A page holds one block of positions for `page_layers` layers
    (those of the group with fewer layers); a block of a group spans `pages_per_block[group]` consecutive pages, one
    per run of `page_layers` of its layers. The runner keeps `page_layers` key (and value) tensors of pages: layer
    `l` reads tensor `placement[l][0]`, `placement[l][1]` pages into each of its blocks. The 30B model: 13 full and
    39 sliding-window layers, pages of 13 layers, a full block one page, a sliding block three."""

    page_layers: int
    pages_per_block: dict[str, int]
    placement: dict[int, tuple[int, int]]

    @property
    def chunk_pages(self) -> int:
        return max(self.pages_per_block.values())


def page_geometry(text: TextConfig) -> PageGeometry:
    layers = {g: text.full_attention_layers if g == FULL else text.sliding_attention_layers
              for g in attention_groups(text)}
    page_layers = min(map(len, layers.values()))
    return PageGeometry(
        page_layers=page_layers,
        pages_per_block={g: _ceil_div(len(group), page_layers) for g, group in layers.items()},
        placement={layer: (i % page_layers, i // page_layers) for group in layers.values()
                   for i, layer in enumerate(group)},
    )


@dataclass(frozen=True)
class KVCacheLayout:
    block_size: int
    num_pages: int  # pages of the target's groups, shared
    pages_per_block: dict[str, int]  # per target group present (PageGeometry)
    sliding_window: int
    # the drafter's context has a pool of its own (its layers have another geometry); None without a drafter
    draft_blocks: int | None = None
    # positions a drafter query may see, its own included (the drafter's window + 1), or None for all
    draft_window: int | None = None

    @property
    def chunk_pages(self) -> int:
        return max(self.pages_per_block.values())

    def blocks_for_one(self, max_model_len: int) -> dict[str, int]:
        """Blocks one sequence of `max_model_len` positions holds in each group, the drafter's included (a windowed
        group's window and the block it grows into)."""
        windows = {g: self.sliding_window if g == SLIDING else None for g in self.pages_per_block}
        if self.draft_blocks is not None:
            windows[DRAFT] = self.draft_window
        return blocks_needed(max_model_len, self.block_size, windows)

    def pages_for_one(self, max_model_len: int) -> int:
        """The shared pages the model's groups take for one sequence of `max_model_len` positions."""
        needs = self.blocks_for_one(max_model_len)
        return sum(needs[g] * pages for g, pages in self.pages_per_block.items())

    def sequences_held(self, max_model_len: int) -> float:
        """How many sequences of `max_model_len` tokens the layout holds at once (vLLM's "maximum concurrency"): its
        pages over the pages one takes, or the drafter's blocks over the blocks one takes there, whichever is
        fewer."""
        held = self.num_pages / self.pages_for_one(max_model_len)
        if self.draft_blocks is not None:
            held = min(held, self.draft_blocks / self.blocks_for_one(max_model_len)[DRAFT])
        return held

    def describe(self) -> str:
        groups = ", ".join(f"a {g} block takes {n}" for g, n in self.pages_per_block.items())
        draft = "" if self.draft_blocks is None else f"; the drafter's own {self.draft_blocks} blocks"
        return f"{self.num_pages} pages of {self.block_size} positions shared by the layer groups ({groups}){draft}"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def most_blocks(window: int | None, block_size: int) -> int | None:
    """The most blocks a sequence holds in a group whose queries see `window` positions: the window's and the block
    it grows into (None: a block for every position)."""
    return None if window is None else _ceil_div(window, block_size) + 1


def blocks_needed(num_tokens: int, block_size: int, windows: dict[str, int | None]) -> dict[str, int]:
    """Blocks a sequence of `num_tokens` positions holds at most in each group, by the positions its queries see
    (None: all)."""
    total = _ceil_div(num_tokens, block_size)
    return {group: total if (most := most_blocks(window, block_size)) is None else min(total, most)
            for group, window in windows.items()}


class KVCacheManager:
    def __init__(self, layout: KVCacheLayout, enable_prefix_caching: bool = True):
        self.block_size = layout.block_size
        self.sliding_window = layout.sliding_window
        # positions a query sees, its own included, per windowed group
        self.windows = {SLIDING: layout.sliding_window, DRAFT: layout.draft_window}
        self.enable_prefix_caching = enable_prefix_caching
        self.pages = PagePool(layout.num_pages, layout.chunk_pages)
        self.pools = {group: KVBlockPool(self.pages, whole_chunk=pages > 1, group=group)
                      for group, pages in layout.pages_per_block.items()}
        # the memories blocks come from: the shared pages, then the drafter's own pool where there is one
        self.page_pools = [self.pages]
        # per page pool, per group in it: (pages a block, most blocks); `pages_for` runs per running sequence a step
        self._page_terms = [[(pages, most_blocks(self.windows.get(group), self.block_size))
                             for group, pages in layout.pages_per_block.items()]]
        if layout.draft_blocks is not None:
            self.pools[DRAFT] = KVBlockPool(layout.draft_blocks, group=DRAFT)
            self.page_pools.append(self.pools[DRAFT].pages)
            self._page_terms.append([(1, most_blocks(layout.draft_window, self.block_size))])
        # prompt tokens of the requests looked up, and those found (their `num_cached_tokens`), as vLLM counts them
        self.prefix_cache_queried_tokens = 0
        self.prefix_cache_hit_tokens = 0

    def first_needed_block(self, group: str, first_query_position: int) -> int:
        """The earliest logical block a query at `first_query_position` (or later) can read."""
        window = self.windows.get(group)
        if window is not None:
            return max(0, first_query_position - window + 1) // self.block_size
        return 0

    def _plan(self, seq: Sequence, group: str, num_new_tokens: int) -> tuple[int, int, range]:
        """(first block to take, end block, indices of blocks now held but no longer needed): the blocks from the
        first the step needs, or past those held, up to `end` are missing.

        A sequence's held blocks are None below the first block its last allocation needed and present from
        there on (allocate and acquire_cached_prefix keep it so), so both ends are found without scanning the
        whole list: a decode step costs the same at any context length.
        """
        first = self.first_needed_block(group, seq.num_computed_tokens)
        end = _ceil_div(seq.num_computed_tokens + num_new_tokens, self.block_size)
        held = seq.blocks.get(group, [])
        stale_end = stale_start = min(first, len(held))
        while stale_start > 0 and held[stale_start - 1] is not None:
            stale_start -= 1
        return max(first, len(held)), end, range(stale_start, stale_end)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self._fits(seq, {group: self._plan(seq, group, num_new_tokens) for group in self.pools})

    def _fits(self, seq: Sequence, plans: dict[str, tuple[int, int, range]]) -> bool:
        """Whether every group's plan (start, end, stale) gets the blocks it is missing, its stale blocks released
        first, from the pages all groups of a pool share. A stale one-page block counts as a free page, though its
        release may make a chunk whole: the answer errs towards no, never yes (the scheduler allocates on a yes)."""
        needs: dict[PagePool, list[int]] = {}  # pages → [chunks missing, pages missing, chunks freed, pages freed]
        for group, (start, end, stale) in plans.items():
            pool = self.pools[group]
            held = seq.blocks.get(group, [])
            count = needs.setdefault(pool.pages, [0, 0, 0, 0])
            side = 0 if pool.whole_chunk else 1
            count[side] += max(0, end - start)
            count[2 + side] += sum(1 for i in stale if pool.ref_counts[held[i]] == 1)
        return all(pages.can_take(chunks, single, freed_chunks, freed_pages)
                   for pages, (chunks, single, freed_chunks, freed_pages) in needs.items())

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Release blocks the step cannot read any more, then take the blocks its new tokens need."""
        self._apply(seq, {group: self._plan(seq, group, num_new_tokens) for group in self.pools})

    def try_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """`allocate` if `can_allocate`, planning each group once (the scheduler's common case); False, and
        nothing changed, if the pages are short."""
        plans = {group: self._plan(seq, group, num_new_tokens) for group in self.pools}
        changes = {group: (start, end, stale) for group, (start, end, stale) in plans.items() if stale or end > start}
        if not changes:  # the step writes into blocks it holds already (most decode steps)
            return True
        if not self._fits(seq, changes):
            return False
        self._apply(seq, changes)
        return True

    def _apply(self, seq: Sequence, plans: dict[str, tuple[int, int, range]]) -> None:
        """Carry out the plans (start, end, stale) of the groups: every stale block released first, then the blocks
        of whole chunks taken before single pages (`_fits` counted them so: a page taken first could split the
        chunk a sliding block needs)."""
        for group, (_, _, stale) in plans.items():
            held, pool = seq.blocks.setdefault(group, []), self.pools[group]
            for i in stale:
                pool.release(held[i])
                held[i] = None
        for group, (start, end, _) in sorted(plans.items(), key=lambda item: not self.pools[item[0]].whole_chunk):
            held, pool = seq.blocks[group], self.pools[group]
            while len(held) < end:
                held.append(None)
            for i in range(start, end):
                held[i] = pool.allocate()

    def step_blocks(self, seq: Sequence, group: str, num_new_tokens: int) -> tuple[list[int | None], int, list[int]]:
        """Where a step's `num_new_tokens` of `seq` read and write in `group` (after `allocate`): the visible
        block ids in order, the position of the first one's first slot, and the slot of each new token."""
        start = seq.num_computed_tokens
        return self.blocks_for(seq, group, start, start + num_new_tokens)

    def blocks_for(self, seq: Sequence, group: str, start: int, end: int) -> tuple[list[int | None], int, list[int]]:
        """For queries at positions >= `start` over keys before `end`: the visible block ids (held: `allocate`
        took them), the position of the first one's first slot, and the slots of positions [start, end)."""
        bs = self.block_size
        first = self.first_needed_block(group, start)
        held = seq.blocks[group]
        visible = held[first : _ceil_div(end, bs)]
        slots: list[int] = []
        for index in range(start // bs, _ceil_div(end, bs)):  # a block's run of slots at a time, not a token's
            base = held[index] * bs
            slots += range(base + max(start - index * bs, 0), base + min(end - index * bs, bs))
        return visible, first * bs, slots

    def decode_blocks(self, seq: Sequence, group: str, position: int) -> tuple[list[int | None], int, int]:
        """`blocks_for(seq, group, position, position + 1)` with its one slot, without the per-position loop
        (a decode step lays out every running sequence this way)."""
        bs = self.block_size
        first = self.first_needed_block(group, position)
        held = seq.blocks[group]
        return held[first : position // bs + 1], first * bs, held[position // bs] * bs + position % bs

    def free(self, seq: Sequence) -> None:
        """Release every block of `seq`, last first: the pool evicts the least recently freed first, so under
        pressure a cached prefix loses its tail blocks before its head, and its leading blocks still hit (a hit
        needs every block from the first on)."""
        for group, pool in self.pools.items():
            for block in reversed(seq.blocks.get(group, [])):
                if block is not None:
                    pool.release(block)
        seq.blocks = {}
        seq.num_registered_blocks = 0

    def blocks_needed_for(self, num_tokens: int) -> dict[str, int]:
        """Blocks a sequence of `num_tokens` needs in each group to make progress alone, one token at a time
        if it must (the scheduler shrinks prefill chunks to fit): the admission check."""
        return blocks_needed(num_tokens, self.block_size, {group: self.windows.get(group) for group in self.pools})

    def pages_for(self, num_tokens: int) -> list[int]:
        """Pages of each page pool (`page_pools`) a sequence of `num_tokens` positions holds at most (in a windowed
        group only the window's blocks)."""
        blocks = _ceil_div(num_tokens, self.block_size)
        return [sum(pages * (blocks if most is None else min(blocks, most)) for pages, most in terms)
                for terms in self._page_terms]

    # prefix caching ----------------------------------------------------------------------------------

    def _block_tokens(self, seq: Sequence, i: int) -> bytes:
        if i < len(seq.block_token_bytes):  # kept when its key was made: a full block's tokens never change
            return seq.block_token_bytes[i]
        return token_bytes(seq.tokens_in(i * self.block_size, (i + 1) * self.block_size))

    def update_block_hashes(self, seq: Sequence) -> None:
        """Extend `seq.block_hashes` to every full block of its current tokens (work only for new blocks)."""
        bs = self.block_size
        while (len(seq.block_hashes) + 1) * bs <= seq.num_tokens:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else root_key(seq.params.cache_salt)
            media = seq.multimodal_hashes_in(i * bs, (i + 1) * bs)
            tokens = self._block_tokens(seq, i)
            seq.block_hashes.append(block_key(parent, tokens, media))
            seq.block_token_bytes.append(tokens)

    def register_computed_blocks(self, seq: Sequence, num_complete_tokens: int | None = None) -> None:
        """Make the newly computed full blocks of `seq` findable by their content keys: those within its first
        `num_complete_tokens` positions (default: every computed one), whose keys/values every group holds."""
        if not self.enable_prefix_caching:
            return
        computed = seq.num_computed_tokens if num_complete_tokens is None else num_complete_tokens
        num_full = computed // self.block_size
        if num_full <= seq.num_registered_blocks:
            return  # a decode step that completed no block: nothing new to register (once per token)
        self.update_block_hashes(seq)
        num_full = min(num_full, len(seq.block_hashes))
        for i in range(seq.num_registered_blocks, num_full):
            tokens = self._block_tokens(seq, i)
            for group, pool in self.pools.items():
                held = seq.blocks.get(group, [])
                if i < len(held) and held[i] is not None:
                    pool.register(held[i], seq.block_hashes[i], tokens)
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    def acquire_cached_prefix(self, seq: Sequence) -> int:
        """Attach the longest usable cached prefix to a sequence with no blocks; returns its token count.

        At least one token is always left to compute, so the step that follows produces logits. The hit-rate
        counts it only when the scheduler admits the sequence (`record_prefix_lookup`): a sequence that waits is
        looked up again at every step, and each retry would count its blocks again.
        """
        if not self.enable_prefix_caching or seq.blocks:
            return 0
        self.update_block_hashes(seq)
        bs = self.block_size
        max_blocks = min(len(seq.block_hashes), (seq.num_tokens - 1) // bs)
        keys = [(seq.block_hashes[i], self._block_tokens(seq, i)) for i in range(max_blocks)]
        found = {group: [pool.lookup(key, tokens) for key, tokens in keys] for group, pool in self.pools.items()}
        best = 0
        for k in range(max_blocks, 0, -1):
            if all(all(b is not None for b in found[group][self._first_cached_block(seq, group, k) : k])
                   for group in self.pools):
                best = k
                break
        if best == 0:
            return 0
        for group, pool in self.pools.items():
            first = self._first_cached_block(seq, group, best)
            held: list[int | None] = [None] * best
            for i in range(first, best):
                held[i] = found[group][i]
                pool.acquire_cached(held[i])
            seq.blocks[group] = held
        seq.num_computed_tokens = best * bs
        seq.num_registered_blocks = best
        return best * bs

    def _first_cached_block(self, seq: Sequence, group: str, hit_blocks: int) -> int:
        """The first of a prefix hit's `hit_blocks` blocks that `group` must find cached. A layer of the model reads
        the window before each position it computes, so the model's groups need the one before the hit. The drafter's
        keys and values of a position are a projection of the target's hidden states there, which the drafter writes
        from the target's forward over the rest of the prompt; its blocks are read only by its proposals, whose first
        anchor is the sequence's last token, so it needs only the window before that, whatever `hit_blocks` is (none
        at all where the rest of the prompt is longer than its window)."""
        if group == DRAFT:
            return self.first_needed_block(group, seq.num_tokens - 1)
        return self.first_needed_block(group, hit_blocks * self.block_size)

    def record_prefix_lookup(self, seq: Sequence, cached_tokens: int) -> None:
        """Count an admitted sequence's lookup (`acquire_cached_prefix`) in the prefix-cache hit-rate: the blocks
        it could have found and those it found. The scheduler counts a request's first admission only: a preempted
        sequence re-admitted looks up its generated tokens too and finds the blocks it just let go, which made the
        rate follow preemptions (vLLM counts those lookups apart, as `preempted_queries`)."""
        if not self.enable_prefix_caching:
            return
        self.prefix_cache_queried_tokens += seq.num_tokens
        self.prefix_cache_hit_tokens += cached_tokens
        queried = min(len(seq.block_hashes), (seq.num_tokens - 1) // self.block_size)
        for pool in self.pools.values():
            pool.record_lookup(queried, cached_tokens // self.block_size)

    def usage(self) -> dict[str, tuple[int, int]]:
        """Per group: (its blocks in use, blocks it could take now: free pages are every group's of the pool)."""
        return {group: (pool.num_used, pool.num_free) for group, pool in self.pools.items()}

    def usage_fraction(self) -> float:
        """The fullest pool's pages in use, 0 to 1."""
        return max(((p.num_pages - p.num_free_pages) / p.num_pages for p in self.page_pools if p.num_pages),
                   default=0.0)

    def prefix_cache_hit_rate(self) -> float:
        queries = sum(p.cache_queries for p in self.pools.values())
        hits = sum(p.cache_hits for p in self.pools.values())
        return hits / queries if queries else 0.0
