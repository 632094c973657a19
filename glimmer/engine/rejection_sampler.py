"""Verifying proposed tokens against the target model while keeping its distribution exactly.

A step that scores [anchor, d1 … dk] for a sequence yields the target's next-token logits at k + 1
positions: row j is the distribution after d1 … dj. Row j goes through exactly what ordinary sampling
would apply had d1 … dj been generated — penalties over the prompt, the outputs and d1 … dj, min_tokens
bans, the grammar's mask at that position, temperature, top-k / top-p / min-p — and verification then
samples position by position:

- greedy: dj is accepted while it is row j's argmax; the first row whose argmax differs, or row k after
  the last draft, gives one more token (the longest matching prefix plus a "bonus" token). The result is
  the greedy output, token for token.
- random: speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023). With p row j's
  processed distribution and q the distribution dj was drawn from, dj is accepted with probability
  min(1, p(dj) / q(dj)); at the first rejection the token is drawn from norm(max(0, p − q)); when every
  draft is accepted the bonus is drawn from row k. Every emitted token is then distributed exactly as
  ordinary sampling would give it. Drafts chosen deterministically (an argmax, a replay) have a one-hot
  q: dj is accepted with probability p(dj) and the residual is p without dj.

Randomness comes from each sequence's generator (a seeded request's own; unseeded ones share the engine's), in
a fixed order: k uniforms, then one draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glimmer.engine.sampler import (
    SamplingRow,
    TokenLogprobs,
    chosen_logprobs,
    constrain,
    draw,
    padding_start,
    sampling_probs,
    widen,
)


@dataclass
class Proposal:
    """One sequence's proposed tokens and the sampling rows of the positions that score them.

    rows: k + 1 rows (k when `bonus` is False); row j is the row ordinary sampling would build after d1 … dj.
    draft_probs: (k, vocab), the distribution each of the k drafts was drawn from; None for deterministic
        drafts.
    bonus: whether to emit a token from the row after the last draft when every draft is accepted.
    """

    rows: list[SamplingRow]
    draft_ids: list[int]
    draft_probs: torch.Tensor | None = None
    bonus: bool = True

    @property
    def greedy(self) -> bool:
        return self.rows[0].params.greedy


@dataclass
class Verdict:
    """The tokens to emit (the accepted drafts, then a correction or bonus token if any) and their logprobs."""

    token_ids: list[int]
    num_accepted: int
    logprobs: list[TokenLogprobs | None]


def verify(logits: torch.Tensor, proposals: list[Proposal], token_bitmask: torch.Tensor | None = None
           ) -> list[Verdict]:
    """logits: one row per row of each proposal, in order (the k + 1 scoring positions of each sequence);
    token_bitmask: the ids each of those rows may take (as `sample` takes it), or None."""
    keys = logits if logits.dtype in (torch.bfloat16, torch.float16) else None  # top-p as `choose_tokens` finds it
    logits, copied = widen(logits)
    rows = [row for proposal in proposals for row in proposal.rows]
    if logits.shape[0] != len(rows):
        raise ValueError(f"verify got {logits.shape[0]} logit rows for {len(rows)} sampling rows")
    starts = [0]
    for proposal in proposals:
        starts.append(starts[-1] + len(proposal.rows))
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(r.params.logprobs is not None for r in rows) else None
    constrained = constrain(logits, rows, token_bitmask, in_place=copied)

    tokens: list[list[int]] = [[] for _ in proposals]
    accepted = [0] * len(proposals)
    greedy = [i for i, p in enumerate(proposals) if p.greedy]
    if greedy:
        index = [r for i in greedy for r in range(starts[i], starts[i + 1])]
        targets = constrained[index].argmax(dim=-1).tolist()
        at = 0
        for i in greedy:
            proposal = proposals[i]
            row_targets = targets[at : at + len(proposal.rows)]
            at += len(proposal.rows)
            m = 0
            while m < len(proposal.draft_ids) and proposal.draft_ids[m] == row_targets[m]:
                m += 1
            accepted[i] = m
            tokens[i] = proposal.draft_ids[:m] + row_targets[m : m + 1]
    sampled = [i for i, p in enumerate(proposals) if not p.greedy]
    if sampled:
        _rejection_sample(constrained, keys, rows, proposals, sampled, starts, tokens, accepted)

    logprobs: list[list[TokenLogprobs | None]] = [[None] * len(t) for t in tokens]
    wanted = [i for i, p in enumerate(proposals) if p.rows[0].params.logprobs is not None]
    if raw_logprobs is not None and wanted:
        index = [starts[i] + j for i in wanted for j in range(len(tokens[i]))]
        emitted = torch.tensor([t for i in wanted for t in tokens[i]], dtype=torch.int64, device=logits.device)
        ks = [proposals[i].rows[0].params.logprobs for i in wanted for _ in tokens[i]]
        token_count = padding_start([proposals[i].rows[0] for i in wanted], logits.shape[1])
        _, entries = chosen_logprobs(raw_logprobs[index], emitted, ks, token_count)
        for i in wanted:
            logprobs[i], entries = entries[: len(tokens[i])], entries[len(tokens[i]) :]
    return [Verdict(tokens[i], accepted[i], logprobs[i]) for i in range(len(proposals))]


def accepts(uniforms: torch.Tensor, p_of_draft: torch.Tensor, q_of_draft: torch.Tensor) -> torch.Tensor:
    """Accept each draft with probability min(1, p(d) / q(d)): u · q(d) < p(d) for u ~ U[0, 1). Strictly: u can
    be 0 (torch.rand includes it), and a draft the target cannot produce (p(d) = 0) must never be accepted."""
    return uniforms * q_of_draft < p_of_draft


def residual(p: torch.Tensor, q: torch.Tensor | None, draft_ids: torch.Tensor) -> torch.Tensor:
    """Rows to draw from after rejecting `draft_ids` (one per row of p): max(0, p − q), unnormalized; for
    drafts chosen deterministically (q None, i.e. one-hot) that is p without the draft."""
    if q is None:
        out = p.scatter(1, draft_ids[:, None], 0.0)
    else:
        out = (p - q).clamp_(min=0)
    # p <= q everywhere only when p == q up to rounding, where a rejection is a rounding artefact
    return torch.where(out.sum(dim=-1, keepdim=True) > 0, out, p)


def _uniforms(proposals: list[Proposal], device: torch.device) -> torch.Tensor:
    """k uniforms per proposal from its sequence's generator (one call per run of proposals sharing one)."""
    pieces, run, generator = [], 0, None
    for proposal in proposals:
        g = proposal.rows[0].generator
        if run and g is not generator:
            pieces.append(torch.rand(run, generator=generator, device=device))
            run = 0
        generator = g
        run += len(proposal.draft_ids)
    if run:
        pieces.append(torch.rand(run, generator=generator, device=device))
    return torch.cat(pieces) if pieces else torch.zeros(0, device=device)


def _rejection_sample(
    constrained: torch.Tensor,
    keys: torch.Tensor | None,
    rows: list[SamplingRow],
    proposals: list[Proposal],
    sampled: list[int],
    starts: list[int],
    tokens: list[list[int]],
    accepted: list[int],
) -> None:
    device = constrained.device
    as_index = lambda values: torch.tensor(values, dtype=torch.int64, device=device)  # noqa: E731
    index = [r for i in sampled for r in range(starts[i], starts[i + 1])]
    probs = sampling_probs(constrained[index], [rows[r] for r in index], None if keys is None else keys[index])
    group = [proposals[i] for i in sampled]
    local = [0]  # each proposal's first row in `probs`
    for proposal in group:
        local.append(local[-1] + len(proposal.rows))
    counts = [len(p.draft_ids) for p in group]
    flat = [0]  # each proposal's first draft in the flat draft order
    for k in counts:
        flat.append(flat[-1] + k)

    # acceptance tests, all sequences at once; q(d) = 1 for deterministic drafts
    draft_ids = as_index([d for p in group for d in p.draft_ids])
    dense = [n for n, p in enumerate(group) if p.draft_probs is not None and counts[n]]
    dense_q = torch.cat([group[n].draft_probs for n in dense]).float() if dense else None
    passes: list[bool] = []
    if draft_ids.numel():
        q_of_draft = torch.ones(draft_ids.numel(), device=device)
        if dense_q is not None:
            positions = as_index([flat[n] + j for n in dense for j in range(counts[n])])
            q_of_draft[positions] = dense_q[torch.arange(len(positions), device=device), draft_ids[positions]]
        draft_rows = as_index([local[n] + j for n, k in enumerate(counts) for j in range(k)])
        passes = accepts(_uniforms(group, device), probs[draft_rows, draft_ids], q_of_draft).tolist()

    # the first rejection (or the bonus row) of each sequence: one draw each
    dense_row = {n: at for at, n in enumerate(dense)}
    dense_starts = [0]
    for n in dense:
        dense_starts.append(dense_starts[-1] + counts[n])
    targets, rejected_dense, rejected_one_hot, generators, owners = [], [], [], [], []
    for n, (i, proposal) in enumerate(zip(sampled, group, strict=True)):
        outcome = passes[flat[n] : flat[n + 1]]
        m = outcome.index(False) if False in outcome else counts[n]
        accepted[i] = m
        tokens[i] = proposal.draft_ids[:m]
        if m == counts[n] and not proposal.bonus:
            continue
        if m < counts[n]:
            rejected = rejected_dense if n in dense_row else rejected_one_hot
            q_at = dense_starts[dense_row[n]] + m if n in dense_row else None
            rejected.append((len(targets), q_at, proposal.draft_ids[m]))
        targets.append(local[n] + m)
        generators.append(proposal.rows[0].generator)
        owners.append(i)
    if not owners:
        return
    rows_to_draw = probs[as_index(targets)]
    for rejected, q_source in ((rejected_dense, dense_q), (rejected_one_hot, None)):
        if rejected:
            at = as_index([r[0] for r in rejected])
            q = None if q_source is None else q_source[as_index([r[1] for r in rejected])]
            rows_to_draw[at] = residual(rows_to_draw[at], q, as_index([r[2] for r in rejected]))
    for i, token in zip(owners, draw(rows_to_draw, generators).tolist(), strict=True):
        tokens[i].append(token)
