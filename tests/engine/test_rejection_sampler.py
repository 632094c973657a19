"""Verification keeps the target's distribution exactly: chi-square tests on a tiny vocabulary.

Each case verifies thousands of proposals for the same scoring rows and compares the emitted tokens with
the target's processed distribution: the first emitted token must follow row 0; the second, emitted only
when the first proposal was accepted, row 1. The same tests run with the acceptance rule or the residual
deliberately broken and must then fail, so they can tell a right rule from a wrong one.
"""

from __future__ import annotations

import pytest
import torch

from glimmer.engine import rejection_sampler
from glimmer.engine.rejection_sampler import Proposal, verify
from glimmer.engine.sampler import SamplingRow, constrain, sampling_probs
from glimmer.engine.sampling_params import SamplingParams

VOCAB = 6
TRIALS = 12000
LOGITS = torch.tensor([[1.2, 0.3, -0.5, 2.0, 0.0, -1.0],
                       [0.1, 1.5, 0.4, -0.3, 0.9, 0.2],
                       [0.5, -0.2, 1.1, 0.0, 0.3, 0.8]])
# the drafter's distribution differs from the target's on purpose
DRAFT_LOGITS = torch.tensor([[2.5, 0.0, 0.0, 0.5, 1.0, -2.0],
                             [0.0, 0.0, 2.0, 0.0, 1.0, 0.0]])

CASES = {
    "sampled-drafts": (SamplingParams(temperature=1.0), "sampled"),
    "sampled-drafts-topk-penalty": (SamplingParams(temperature=0.7, top_k=4, presence_penalty=0.8), "sampled"),
    "argmax-drafts-topp": (SamplingParams(temperature=1.3, top_p=0.9), "argmax"),
}
# penalties are applied row by row: fewer trials keep that case fast
TRIALS_OF = {"sampled-drafts-topk-penalty": TRIALS // 3}


def _p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    keep = expected_probs > 0
    assert counts[~keep].sum() == 0, "a token the target cannot produce was emitted"
    expected = expected_probs[keep] * counts.sum()
    statistic = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), statistic / 2))


def _run(params: SamplingParams, drafting: str, trials: int = TRIALS
         ) -> tuple[list[list[int]], list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    proposals, drafts = [], []
    q = torch.softmax(DRAFT_LOGITS, dim=-1)
    if drafting == "sampled":
        all_ids, probs = torch.multinomial(q, trials, replacement=True, generator=generator).T.tolist(), q
    else:
        all_ids, probs = [q.argmax(dim=-1).tolist()] * trials, None
    for ids in all_ids:
        rows = [SamplingRow(params, [0], ids[:j], generator) for j in range(3)]
        proposals.append(Proposal(rows, ids, probs))
        drafts.append(ids)
    verdicts = verify(LOGITS.repeat(trials, 1), proposals)
    emitted = [v.token_ids for v in verdicts]
    row_probs = [sampling_probs(constrain(LOGITS[j : j + 1], [p.rows[j]]), [p.rows[j]])[0] for j, p in
                 ((0, proposals[0]), (1, proposals[0]))]
    return emitted, row_probs, torch.tensor(drafts)


def _first_and_second(emitted, drafts):
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).float()
    # the second token exists only after an accepted first proposal; every such trial shares one prefix when
    # drafts are deterministic, and for sampled drafts we keep the trials whose first proposal was token 0
    second = [e[1] for e, d in zip(emitted, drafts.tolist(), strict=True) if len(e) > 1 and d[0] == 0]
    return first, torch.bincount(torch.tensor(second), minlength=VOCAB).float()


@pytest.mark.parametrize("case", list(CASES))
def test_emitted_tokens_follow_the_target_distribution(case):
    params, drafting = CASES[case]
    emitted, (p0, p1), drafts = _run(params, drafting, TRIALS_OF.get(case, TRIALS))
    first, second = _first_and_second(emitted, drafts)
    assert _p_value(first, p0) > 1e-3
    if drafting == "argmax":
        assert drafts[0, 0] == 0  # the argmax draft is token 0, so `second` holds every accepted trial
    assert second.sum() > 300
    assert _p_value(second, p1) > 1e-3
    accepted = sum(len(e) - 1 for e in emitted) / len(emitted)
    assert 0.1 < accepted < 2  # some proposals accepted, some rejected: both paths ran


BROKEN = {
    # the residual left out: a rejected proposal falls back to the target's own distribution
    "residual-is-p": ("residual", lambda p, q, draft: p),
    # accepting with probability p(d) whatever the draft distribution was (right only for one-hot q)
    "ignores-q": ("accepts", lambda u, p, q: u <= p),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_acceptance_rule_fails_the_same_test(monkeypatch, broken):
    name, rule = BROKEN[broken]
    monkeypatch.setattr(rejection_sampler, name, rule)
    emitted, (p0, _), drafts = _run(*CASES["sampled-drafts"])
    first, _ = _first_and_second(emitted, drafts)
    assert _p_value(first, p0) < 1e-6


def test_greedy_verification_is_the_longest_matching_prefix_plus_one():
    greedy = SamplingParams(temperature=0)
    targets = LOGITS.argmax(dim=-1).tolist()  # [3, 1, 2]
    rows = [SamplingRow(greedy, [0], [], None)] * 3
    cases = {(3, 1): ([3, 1, 2], 2), (3, 4): ([3, 1], 1), (5, 1): ([3], 0)}
    for drafts, (tokens, accepted) in cases.items():
        verdict = verify(LOGITS, [Proposal(rows, list(drafts))])[0]
        assert (verdict.token_ids, verdict.num_accepted) == (tokens, accepted)
    assert targets == [3, 1, 2]


def test_without_proposals_verification_is_ordinary_sampling():
    """Zero proposed tokens: the same draw, from the same generator state, as the sampler makes."""
    from glimmer.engine.sampler import sample

    params = SamplingParams(temperature=0.9, top_k=5)
    got = verify(LOGITS[:1], [Proposal([SamplingRow(params, [0], [], torch.Generator().manual_seed(7))], [])])
    expected = sample(LOGITS[:1], [SamplingRow(params, [0], [], torch.Generator().manual_seed(7))])
    assert got[0].token_ids == expected.token_ids


def test_a_draft_the_target_cannot_produce_is_rejected_even_at_a_uniform_of_zero(monkeypatch):
    """torch.rand draws from [0, 1), 0 included (one draw in 2**24 for float32): a draft outside the target's
    top-k (p(d) = 0) must be rejected at u = 0 too, or verification emits a token ordinary sampling never would
    (a filtered one, or one a grammar's mask forbids)."""
    monkeypatch.setattr(rejection_sampler, "_uniforms", lambda proposals, device: torch.zeros(
        sum(len(p.draft_ids) for p in proposals), device=device))
    params = SamplingParams(temperature=1.0, top_k=2)  # row 0 keeps tokens 3 and 0 only
    q = torch.softmax(DRAFT_LOGITS[:1], dim=-1)
    for draft in range(VOCAB):
        rows = [SamplingRow(params, [0], [draft][:j], torch.Generator().manual_seed(draft)) for j in range(2)]
        verdict = verify(LOGITS[:2], [Proposal(rows, [draft], q)])[0]
        assert verdict.num_accepted == (draft in (3, 0)), draft
        assert verdict.token_ids[0] in (3, 0)
