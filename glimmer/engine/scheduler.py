"""Continuous batching: which sequences run in the next step, and how many tokens each computes.

Each step first serves the running sequences (a decode token, or the next chunk of a long prompt; with
speculative decoding a decode also carries the tokens proposed for verification, as far as the token
budget and the KV pools allow — what does not fit is dropped), then admits waiting ones while the token
budget, the sequence limit and the KV pools allow. When a running sequence cannot get blocks, the most
recently admitted other sequence is preempted: its blocks are freed and it goes back to the front of the
queue to be recomputed later (prefix caching usually makes that cheap). After the step ran, `postprocess` offers
the full blocks it computed to the prefix cache and retires the sequences it ended. Knows nothing of tensors.

Admission leaves room for the running sequences to grow (as SGLang's scheduler does): each is expected to generate
`growth_ratio` of the tokens it may still generate (at most GROWTH_CLIP of them), and a waiting sequence is admitted
while the free pages cover its chunk, the rest of its prompt and everyone's expected growth, in every page pool (the
target's shared pages, and the drafter's own blocks under speculative decoding: past the target's sliding window
those are the scarcer, the drafter seeing the whole context). The ratio falls by RATIO_DECAY a step towards
RATIO_MIN while nothing is preempted, and a preemption sets it to 1: admitting whatever fits now made a full cache
thrash, each re-admitted sequence preempted again as the others grew (the 30B's 256 × 1K-in/256-out load on a 7.2 GB
cache recomputed 67% of its positions).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Protocol

from glimmer.engine.kv_cache_manager import KVCacheManager
from glimmer.engine.sequence import Sequence, SequenceStatus

RATIO_INITIAL = 0.7
RATIO_MIN = 0.1
RATIO_DECAY = 0.001
GROWTH_CLIP = 4096


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass
class ScheduledStep:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # including the proposed tokens to verify
    num_spec_tokens: list[int] = field(default_factory=list)  # proposed tokens among them (default: none)
    preempted: list[Sequence] = field(default_factory=list)  # sent back to the queue while scheduling this step

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    def spec_tokens(self, i: int) -> int:
        return self.num_spec_tokens[i] if self.num_spec_tokens else 0

    def samples(self, i: int) -> bool:
        """Whether sequence i's chunk reaches its last token, so the step yields its next token(s)."""
        seq = self.seqs[i]
        return (seq.num_computed_tokens + self.num_new_tokens[i]
                == seq.num_tokens + seq.num_pending_tokens + self.spec_tokens(i))

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.num_spec_tokens.append(len(seq.spec_token_ids))

    def commit(self, committed: list[int]) -> None:
        """The step ran: `committed[i]` of seqs[i]'s scheduled tokens are computed for good (proposed tokens that
        were rejected, or dropped at a stop, are not)."""
        for seq, count in zip(self.seqs, committed, strict=True):
            seq.num_computed_tokens += count


class DrafterContext(Protocol):
    """What the KV bookkeeping asks of speculative decoding (spec_decode.py), whose drafter context can lag behind
    the target's (draft_context.py): a block is complete, and offered to the prefix cache, once both hold it."""

    def context_complete_through(self, seq: Sequence) -> int:
        """How many leading positions of `seq` have their keys/values in every group, the drafter's included."""

    def complete_full_blocks(self, seq: Sequence, block_size: int) -> None:
        """`seq` ends: write the drafter context its computed full blocks wait for."""

    def release(self, seq: Sequence) -> None:
        """Drop the drafter context kept for `seq`, whose blocks are freed."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, drafter: DrafterContext | None = None):
        self.config = config
        self.kv = kv
        self.drafter = drafter
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.growth_ratio = RATIO_INITIAL
        self._reserved_pages = 0  # what the last admission check kept (`reserved_pages`)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def reserved_pages(self) -> int:
        """Pages the last admission check kept for the running sequences' growth, leaving the first waiting request
        waiting (in the first page pool found short: the shared pages, else the drafter's blocks): why requests can wait
        while pages are free (/metrics). 0 while none waits: the request kept waiting may have left the queue since
        (aborted), and an engine with nothing left to run takes no step to say so."""
        return self._reserved_pages if self.waiting else 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        budget = self.config.max_num_batched_tokens
        step = ScheduledStep([], [])
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            wanted = seq.num_uncomputed_tokens + len(seq.spec_token_ids)
            n = min(wanted, budget)
            if not self.kv.try_allocate(seq, n):
                n = self._fit_chunk(seq, n)
                while n == 0:
                    victim = self._pick_victim(exclude=seq, scheduled=step.seqs)
                    if victim is None:
                        break
                    self._preempt(victim)
                    step.preempted.append(victim)
                    n = self._fit_chunk(seq, min(wanted, budget))
                if n == 0:
                    self._preempt(seq)
                    step.preempted.append(seq)
                    continue
                self.kv.allocate(seq, n)
            seq.keep_spec_tokens(max(0, n - seq.num_uncomputed_tokens))
            step.add(seq, n)
            budget -= n
            index += 1

        self.growth_ratio = 1.0 if step.preempted else max(RATIO_MIN, self.growth_ratio - RATIO_DECAY)
        reserve = None  # per page pool, what the running sequences are expected to grow by (summed once one waits)
        self._reserved_pages = 0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = None  # tokens found in the prefix cache, where it was looked up
            if not seq.blocks and not seq.scores_prompt:
                cached = self.kv.acquire_cached_prefix(seq)
                if seq.num_preemptions == 0:
                    seq.num_cached_tokens = cached
            n = self._fit_chunk(seq, min(seq.num_uncomputed_tokens, budget))
            if n and self.running:
                if reserve is None:  # each running sequence holds what it computed and what it computes now
                    now = dict(zip(step.seqs, step.num_new_tokens, strict=True))
                    growths = [self._expected_growth(s, s.num_computed_tokens + now.get(s, 0)) for s in self.running]
                    reserve = [sum(pool) for pool in zip(*growths, strict=True)]
                chunk_end = seq.num_computed_tokens + n
                growth = self._expected_growth(seq, chunk_end)
                short = [kept for pool, taken, held, kept, grows in zip(
                    self.kv.page_pools, self.kv.pages_for(chunk_end), self.kv.pages_for(seq.num_computed_tokens),
                    reserve, growth, strict=True) if pool.num_free_pages - taken + held < kept + grows]
                if short:
                    n = 0
                    self._reserved_pages = short[0]
            if n == 0:
                # a waiting sequence holds no blocks: cached ones it found go back (still findable by hash),
                # so they can never keep the sequences ahead of it from running
                self.kv.free(seq)
                seq.num_computed_tokens = 0
                break
            self.waiting.popleft()
            if cached is not None and seq.num_preemptions == 0 and seq.counts_prefix_lookup:  # as usage's
                # cached_tokens: a request's prompt once, a beam search's at its first step
                self.kv.record_prefix_lookup(seq, cached)
            self.kv.allocate(seq, n)
            if seq.first_scheduled_time is None:  # a preempted sequence re-admitted keeps its first time
                seq.first_scheduled_time = time.time()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            step.add(seq, n)
            budget -= n
            if reserve is not None:
                reserve = [kept + grows for kept, grows in zip(reserve, growth, strict=True)]
        return step

    def _expected_growth(self, seq: Sequence, held_end: int) -> list[int]:
        """Pages of each page pool (`KVCacheManager.page_pools`) `seq`, holding positions up to `held_end`, is
        expected to need beyond them: the rest of its prompt, and `growth_ratio` of the tokens it may still generate
        (at most GROWTH_CLIP)."""
        prompt_end = max(len(seq.prompt_token_ids), seq.num_tokens)
        may_generate = min(seq.max_total_tokens - prompt_end, GROWTH_CLIP)
        end = prompt_end + math.ceil(self.growth_ratio * max(may_generate, 0))
        return [max(0, grown - held) for grown, held in zip(self.kv.pages_for(end), self.kv.pages_for(held_end),
                                                             strict=True)]

    def _fit_chunk(self, seq: Sequence, n: int) -> int:
        """The largest chunk of at most n tokens whose blocks can be allocated now (0 if none can).

        Shrinking a prefill chunk lets a long prompt progress through a small sliding-window pool.
        """
        if self.kv.can_allocate(seq, n):
            return n
        low, high = 0, n - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self.kv.can_allocate(seq, mid):
                low = mid
            else:
                high = mid - 1
        return low

    def _pick_victim(self, exclude: Sequence, scheduled: list[Sequence]) -> Sequence | None:
        for seq in reversed(self.running):
            if seq is not exclude and seq not in scheduled:
                return seq
        return None

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks and requeue it at the front, to be recomputed."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.keep_spec_tokens(0)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        if self.drafter is not None:  # its drafter blocks are freed: the context pending for them goes too
            self.drafter.release(seq)

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Offer `seq`'s newly computed full blocks to the prefix cache: a registered block is complete in every
        group, the drafter's context included."""
        drafter = self.drafter
        self.kv.register_computed_blocks(seq, drafter.context_complete_through(seq) if drafter is not None else None)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """`seq` ends: offer every full block it computed to the prefix cache, writing first the drafter context
        they wait for, which no later step would write."""
        if self.drafter is not None and self.kv.enable_prefix_caching:
            self.drafter.complete_full_blocks(seq, self.kv.block_size)
        self.register_computed_blocks(seq)

    def postprocess(self, step: ScheduledStep | None, ended: list[Sequence], failed: Container[str] = ()) -> None:
        """After a step ran and its tokens were committed (`ScheduledStep.commit`): offer the full blocks its
        sequences computed to the prefix cache (None: a step run ahead, whose blocks were offered as its tokens
        were read), then retire the sequences that `ended` with it, their blocks cached whole first (a follow-up
        turn, their prompt and output, finds every one) unless their request is among the `failed`."""
        if step is not None:
            for seq in step.seqs:
                self.register_computed_blocks(seq)
        for seq in ended:
            if not seq.is_finished and seq.request_id not in failed:
                self.cache_full_blocks(seq)
        self.retire(ended)

    def retire(self, ended: list[Sequence]) -> None:
        """Finish those of `ended` not finished yet, freeing their blocks (`postprocess` caches them first; after a
        step that failed they go uncached)."""
        for seq in ended:
            if not seq.is_finished:
                self.finish(seq)

    def finish(self, seq: Sequence) -> None:
        """Retire a sequence (finished or aborted), wherever it is."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.keep_spec_tokens(0)
        seq.penalty_ids = None
        seq.status = SequenceStatus.FINISHED
        if self.drafter is not None:
            self.drafter.release(seq)
