"""Proposers: where the tokens a speculative step verifies come from.

A proposer sees, after every step, the target's hidden states of the positions the step committed, and
proposes tokens for the sequences that will decode next. `DFlashProposer` runs the DFlash drafter
(architecture.md §10): it caches each committed position's drafter keys and values in the paged pool's
draft group, then denoises one block [anchor, mask, …] per sequence. `ReplayProposer` is for tests and
benchmarks: it proposes a known continuation with mistakes where a schedule puts them, so a run has a
chosen acceptance.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from glimmer.engine.draft_context import CommittedContext, ContextRows, PendingContext
from glimmer.engine.draft_graphs import DraftGraphs, DraftLayout
from glimmer.engine.grammar import GrammarWalk
from glimmer.engine.kv_cache_manager import DRAFT, KVCacheManager
from glimmer.engine.sampler import SamplingRow, constrain, draw, plain_greedy, sampling_probs, widen
from glimmer.engine.sequence import Sequence
from glimmer.model.drafter import DFlashDrafter, DraftStep
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None  # (k, vocab) the distribution each token was drawn from; None: deterministic


class Proposer(Protocol):
    max_draft_tokens: int

    def propose(self, context: CommittedContext, requests: list[tuple[Sequence, int]]) -> list[Draft]:
        """Record the committed context; return up to k tokens for each (sequence, k) of `requests`, whose
        last token (the anchor, not yet scored by the target) sits at position num_tokens − 1."""

    def first_pending(self, seq: Sequence) -> int | None:
        """The first committed position of `seq` whose drafter context is not cached yet (None: all are)."""

    def write_pending(self) -> None:
        """Cache the drafter context of every committed position now (a sequence ends: no later step would)."""

    def release(self, seq: Sequence) -> None:
        """`seq` finished or was preempted: forget what is kept for it."""


class DFlashProposer:
    """The DFlash drafter in the engine: its context keys/values live in the KV pool's draft group.

    A step that proposes nothing leaves its context for the next one that does (draft_context.py). On CUDA,
    the drafter steps of decoding batches replay from CUDA graphs (draft_graphs.py).
    """

    def __init__(
        self,
        drafter: DFlashDrafter,
        target: MuseGlimmerForConditionalGeneration,
        kv: KVCacheManager,
        device: torch.device,
        dtype: torch.dtype,
        *,
        max_num_seqs: int = 256,
        use_cuda_graphs: bool = True,
        progress: bool = False,
        token_count: int | None = None,
    ):
        config = drafter.config
        self.drafter = drafter
        self.target = target
        self.kv = kv
        self.device = device
        self.max_draft_tokens = config.num_draft_tokens
        self.token_count = token_count  # the tokenizer's ids: logit rows past them are padding, never proposed
        self.block_size = config.block_size
        self.mask_token_id = config.mask_token_id
        # one spare block, owned by no sequence: padding rows of captured steps write there
        null_block = kv.pools[DRAFT].num_blocks
        shape = (null_block + 1, kv.block_size, config.num_key_value_heads, config.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(config.num_hidden_layers)
        ]
        # pending positions per sequence: a catch-up with the next step's own row stays within one block
        self.pending = PendingContext(self.block_size - 1, kv.block_size)
        self.graphs: DraftGraphs | None = None
        if device.type == "cuda" and use_cuda_graphs:
            self.graphs = DraftGraphs(drafter, target.embed_tokens.raw, self.kv_caches, null_block, max_num_seqs,
                                      device, widest=self.widest_table())
            self.graphs.capture_graphs(progress)  # now, not while requests wait

    def widest_table(self) -> int | None:
        """The most cache blocks one block's visible context spans (a window's worth, plus one where it straddles
        a block boundary); None where the drafter sees its whole context."""
        window = self.kv.windows[DRAFT]
        return None if window is None else -(-window // self.kv.block_size) + 1

    def first_pending(self, seq: Sequence) -> int | None:
        return self.pending.first_pending(seq)

    def release(self, seq: Sequence) -> None:
        self.pending.drop(seq)

    @torch.inference_mode()
    def write_pending(self) -> None:
        written = self.pending.take(CommittedContext([], [], [], [], []))
        if written.seqs:
            self._run(written, [])

    @torch.inference_mode()
    def propose(self, context: CommittedContext, requests: list[tuple[Sequence, int]]) -> list[Draft]:
        if not requests and self.pending.defer(context):
            return []
        written = self.pending.take(context)
        if not requests and not written.seqs:
            return []
        hidden = self._run(written, [seq for seq, _ in requests])
        if not requests:
            return []
        most = max(k for _, k in requests)
        # raw lm_head: no output multiplier, no softcap (§10.1). Rows as one contiguous matrix: over the strided
        # (B, k, H) slice cuBLAS takes a batched kernel that ran 13x slower on the H200 at batch 64
        rows = hidden[:, 1 : 1 + most].reshape(-1, hidden.shape[-1])
        logits = self.target.lm_head(rows).view(len(requests), most, -1)
        return self._choose(logits, requests)

    def _run(self, written: ContextRows, seqs: list[Sequence]) -> torch.Tensor:
        """One drafter forward: write the context rows `written`, and denoise a block for each of `seqs`."""
        layout = self._layout(written, seqs)
        # a graph serves steps where every sequence drafts (the same ones that bring context) or none does
        aligned = not seqs or (len(written.seqs) == len(seqs)
                               and all(a is b for a, b in zip(written.seqs, seqs, strict=True)))
        if self.graphs is not None and aligned and self.graphs.can_run(layout):
            return self.graphs.run(layout, written.states)
        return self._forward(layout, written.states)

    def _layout(self, rows: ContextRows, seqs: list[Sequence]) -> DraftLayout:
        layout = DraftLayout()
        for seq, start, seq_rows in zip(rows.seqs, rows.starts, rows.rows, strict=True):
            layout.context_positions.append(list(range(start, start + len(seq_rows))))
            layout.context_slots.append(self.kv.blocks_for(seq, DRAFT, start, start + len(seq_rows))[2])
            layout.context_rows.append(seq_rows)
        for seq in seqs:
            anchor = seq.num_tokens - 1  # the last token: not yet scored by the target
            visible, first, _ = self.kv.blocks_for(seq, DRAFT, anchor, anchor)
            layout.anchor_ids.append(seq.output_token_ids[-1])
            layout.anchor_positions.append(anchor)
            layout.tables.append(visible)
            layout.table_starts.append(first)
        return layout

    def _forward(self, layout: DraftLayout, states: torch.Tensor | None) -> torch.Tensor:
        """states: the context rows' concatenated target hidden states, indexed by layout.context_rows."""
        n, t = len(layout.anchor_ids), self.block_size
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)  # noqa: E731
        rows = [r for seq_rows in layout.context_rows for r in seq_rows]
        if not rows:
            states = torch.zeros((0, self.drafter.encoder.fc.in_features), device=self.device)
        elif rows != list(range(states.shape[0])):
            states = states[as_tensor(rows)]
        width = max([len(table) for table in layout.tables] + [1])
        step = DraftStep(
            block_size=self.kv.block_size,
            context_positions=as_tensor([p for seq in layout.context_positions for p in seq]),
            context_slots=as_tensor([s for seq in layout.context_slots for s in seq]),
            block_positions=as_tensor([list(range(a, a + t)) for a in layout.anchor_positions]).reshape(n, t),
            block_tables=as_tensor([row + [0] * (width - len(row)) for row in layout.tables]).reshape(n, width),
            kv_start_pos=as_tensor(layout.table_starts),
            context_lens=as_tensor(layout.anchor_positions),
        )
        ids = as_tensor([[a] + [self.mask_token_id] * (t - 1) for a in layout.anchor_ids]).reshape(n, t)
        # raw embedding rows: the drafter bypasses the target's embedding norm (§10.1, §14.3)
        return self.drafter.forward_paged(states, self.target.embed_tokens.raw(ids), step, self.kv_caches)

    def _choose(self, logits: torch.Tensor, requests: list[tuple[Sequence, int]]) -> list[Draft]:
        """Each request's drafts under the masks its sampling and its grammar apply (`_constrained`), so that none
        is a token verification must reject. Greedy requests take the argmax of those logits; sampled ones draw from
        their softmax under the request's temperature and top-k/top-p/min-p (that distribution is what verification
        compares against). Greedy requests whose sampling masks nothing but the vocabulary's padding rows take the
        drafter's argmax over the tokenizer's ids, read in place (a request whose first position bans nothing bans
        nothing at the later ones: see `_row`)."""
        drafts: list[Draft | None] = [None] * len(requests)
        plain = [i for i, (seq, _) in enumerate(requests)
                 if seq.controller is None and plain_greedy(self._row(seq, 0))]
        if plain:
            real = logits[..., : self.token_count]
            chosen = (real if len(plain) == len(requests) else real[plain]).argmax(dim=-1).tolist()
            for i, ids in zip(plain, chosen, strict=True):
                drafts[i] = Draft(ids[: requests[i][1]], None)
        for i, (seq, k) in enumerate(requests):
            if drafts[i] is None:
                drafts[i] = self._constrained(logits[i, :k], seq, k)
        return drafts

    def _constrained(self, logits: torch.Tensor, seq: Sequence, k: int) -> Draft:
        """Up to k drafts from `logits` (k, vocab) under what sampling applies at each position: the logit bias,
        allowed and banned ids and the padding rows (`sampler.constrain`; not the penalties, which read the tokens
        before, not chosen yet). The draft stops before a position where no token is left."""
        rows = [self._row(seq, j) for j in range(k)]
        widened, copied = widen(logits)
        if seq.controller is not None:
            return self._under_grammar(logits, widened, copied, seq, rows)
        ids, open_, probs = _pick(logits, constrain(widened, rows, in_place=copied, penalties=False), rows, seq)
        n = open_.index(0) if 0 in open_ else k
        return Draft(ids[:n], None if probs is None else probs[:n])

    @staticmethod
    def _under_grammar(logits: torch.Tensor, widened: torch.Tensor, copied: bool, seq: Sequence,
                       rows: list[SamplingRow]) -> Draft:
        """`_constrained` of a sequence under a grammar: position by position, each masked as well by the grammar
        after the drafts before it (`GrammarWalk`, a copy of its matcher), until the grammar stops or leaves no id."""
        walk = GrammarWalk(seq.controller)
        ids: list[int] = []
        dists: list[torch.Tensor] = []
        for j, row in enumerate(rows):
            mask = walk.mask()
            if mask is None:
                break
            constrained = constrain(widened[j : j + 1], [row], mask[None], in_place=copied, penalties=False)
            [token_id], [open_], probs = _pick(logits[j : j + 1], constrained, [row], seq)
            if not open_:
                break
            ids.append(token_id)
            if probs is not None:
                dists.append(probs)
            walk.advance(token_id)
        return Draft(ids, torch.cat(dists) if dists else None)

    def _row(self, seq: Sequence, j: int) -> SamplingRow:
        """The sampler's row for draft position j of `seq` (after j proposed tokens, not chosen yet). Its output ids
        are the committed ones: no penalty applies to drafts."""
        banned = seq.banned_ids(seq.output_token_ids + [-1] * j) if seq.bad_word_ids or seq.params.min_tokens else ()
        return SamplingRow(seq.params, seq.prompt_token_ids, seq.output_token_ids, seq.generator, banned,
                           self.token_count)


def _pick(logits: torch.Tensor, constrained: torch.Tensor, rows: list[SamplingRow], seq: Sequence
          ) -> tuple[list[int], list[int], torch.Tensor | None]:
    """One draft token per row of `constrained` (`logits` under the rows' masks, float32): the argmax for a greedy
    request; for a sampled one a draw from the distribution its sampling gives, returned beside the tokens (what
    verification compares against). Also whether any token was left at each row (0 where all were masked)."""
    probs = None
    if seq.params.greedy:
        tokens = constrained.argmax(dim=-1)
    else:
        keys = logits if logits.dtype in (torch.bfloat16, torch.float16) else None
        probs = sampling_probs(constrained, rows, keys, moved=bool(seq.params.logit_bias))
        tokens = draw(probs, [seq.generator] * len(rows))
    ids, open_ = torch.stack([tokens, torch.isfinite(constrained.amax(dim=-1)).long()]).tolist()
    return ids, open_, probs


class ReplayProposer:
    """Proposes a known continuation of each prompt with chosen mistakes (tests and benchmarks only).

    continuation(seq) gives the tokens the target will produce after the prompt (e.g. recorded from a run
    without speculation), or None to propose nothing; correct(seq, k) says how many of the k proposed
    tokens of this step are right — the next one is replaced by mistake(seq, output index, right token)
    (default: the next id). If `inner` is given, it runs first (so a step costs what the real drafter
    costs) and its proposals are discarded.
    """

    def __init__(
        self,
        continuation: Callable[[Sequence], list[int] | None],
        correct: Callable[[Sequence, int], int],
        vocab_size: int,
        max_draft_tokens: int,
        inner: Proposer | None = None,
        mistake: Callable[[Sequence, int, int], int] | None = None,
    ):
        self.continuation = continuation
        self.correct = correct
        self.vocab_size = vocab_size
        self.max_draft_tokens = max_draft_tokens
        self.inner = inner
        self.mistake = mistake or (lambda seq, index, right: (right + 1) % vocab_size)

    def first_pending(self, seq: Sequence) -> int | None:
        return self.inner.first_pending(seq) if self.inner is not None else None

    def write_pending(self) -> None:
        if self.inner is not None:
            self.inner.write_pending()

    def release(self, seq: Sequence) -> None:
        if self.inner is not None:
            self.inner.release(seq)

    def propose(self, context: CommittedContext, requests: list[tuple[Sequence, int]]) -> list[Draft]:
        if self.inner is not None:
            self.inner.propose(context, requests)
        drafts = []
        for seq, k in requests:
            known = self.continuation(seq)
            if known is None:
                drafts.append(Draft([], None))
                continue
            done = len(seq.output_token_ids)
            ahead = known[done:]
            good = min(self.correct(seq, k), k, len(ahead))
            wrong = [self.mistake(seq, done + j, t) for j, t in enumerate((ahead + [0] * k)[good:k], start=good)]
            drafts.append(Draft(ahead[:good] + wrong, None))
        return drafts


def _per_sequence_schedule(correct_at: Callable[[int], int]) -> Callable[[Sequence, int], int]:
    """A `correct` schedule for ReplayProposer giving a sequence's t-th proposal correct_at(t) correct tokens. The
    count t is kept per sequence object, weakly: a finished sequence's id can be a new one's, and a new sequence must
    start the schedule afresh (a schedule keyed by id() made seeded runs differ by chance)."""
    counts: weakref.WeakKeyDictionary[Sequence, int] = weakref.WeakKeyDictionary()

    def correct(seq: Sequence, k: int) -> int:
        t = counts.get(seq, 0)
        counts[seq] = t + 1
        return correct_at(t)

    return correct


def forced_acceptance(mean_accepted: float) -> Callable[[Sequence, int], int]:
    """A `correct` schedule for ReplayProposer whose long-run mean of correct tokens per step is
    `mean_accepted` (so the mean acceptance length is mean_accepted + 1): floor((t+1)·m) − floor(t·m) at a
    sequence's t-th proposal."""
    return _per_sequence_schedule(lambda t: int((t + 1) * mean_accepted) - int(t * mean_accepted))


def cycling_acceptance(*pattern: int) -> Callable[[Sequence, int], int]:
    """A `correct` schedule for ReplayProposer: a sequence's t-th proposal has pattern[t % len(pattern)] correct
    tokens (ReplayProposer keeps it to the k proposed and to the continuation it knows)."""
    return _per_sequence_schedule(lambda t: pattern[t % len(pattern)])
