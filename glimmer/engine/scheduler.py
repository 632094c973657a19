"""Continuous batching: which sequences run in the next step, and how many tokens each computes.

Each step first serves the running sequences (a decode token, or the next chunk of a long prompt; with
speculative decoding a decode also carries the tokens proposed for verification, as far as the token
budget and the KV pools allow — what does not fit is dropped), then admits waiting ones while the token
budget, the sequence limit and the KV pools allow. When a running sequence cannot get blocks, the most
recently admitted other sequence is preempted: its blocks are freed and it goes back to the front of the
queue to be recomputed later (prefix caching usually makes that cheap). Knows nothing of tensors.

Admission leaves room for the running sequences to grow (as SGLang's scheduler does): each is expected to
generate `growth_ratio` of the tokens it may still generate (at most GROWTH_CLIP of them), and a waiting
sequence is admitted while the free pages cover its chunk, the rest of its prompt and everyone's expected
growth. The ratio falls by RATIO_DECAY a step towards RATIO_MIN while nothing is preempted, and a preemption
sets it to 1: admitting whatever fits now made a full cache thrash, each re-admitted sequence preempted again
as the others grew (the 30B's 256 × 1K-in/256-out load on a 7.2 GB cache recomputed 67% of its positions).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

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


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.growth_ratio = RATIO_INITIAL
        # pages the last admission check kept for the running sequences' growth (0 when none waited): why requests
        # can wait while pages are free (/metrics)
        self.reserved_pages = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

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
        reserve = None  # pages the running sequences are expected to grow by (summed once a sequence waits)
        self.reserved_pages = 0
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
                    reserve = sum(self._expected_growth(s, s.num_computed_tokens + now.get(s, 0))
                                  for s in self.running)
                chunk_end = seq.num_computed_tokens + n
                growth = self._expected_growth(seq, chunk_end)
                free = self.kv.pages.num_free_pages - self.kv.pages_for(chunk_end) + self.kv.pages_for(
                    seq.num_computed_tokens)
                if free < reserve + growth:
                    n = 0
                    self.reserved_pages = reserve
            if n == 0:
                # a waiting sequence holds no blocks: cached ones it found go back (still findable by hash),
                # so they can never keep the sequences ahead of it from running
                self.kv.free(seq)
                seq.num_computed_tokens = 0
                break
            self.waiting.popleft()
            if cached is not None and seq.num_preemptions == 0:  # as usage's cached_tokens: a request's prompt once
                self.kv.record_prefix_lookup(seq, cached)
            self.kv.allocate(seq, n)
            if seq.first_scheduled_time is None:  # a preempted sequence re-admitted keeps its first time
                seq.first_scheduled_time = time.time()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            step.add(seq, n)
            budget -= n
            if reserve is not None:
                reserve += growth
        return step

    def _expected_growth(self, seq: Sequence, held_end: int) -> int:
        """Pages `seq`, holding positions up to `held_end`, is expected to need beyond them: the rest of its prompt,
        and `growth_ratio` of the tokens it may still generate (at most GROWTH_CLIP)."""
        prompt_end = max(len(seq.prompt_token_ids), seq.num_tokens)
        may_generate = min(seq.max_total_tokens - prompt_end, GROWTH_CLIP)
        end = prompt_end + math.ceil(self.growth_ratio * max(may_generate, 0))
        return max(0, self.kv.pages_for(end) - self.kv.pages_for(held_end))

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
