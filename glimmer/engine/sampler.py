"""Turn a batch of next-token logits into tokens, each row under its own sampling parameters.

Order per row (as vLLM): penalties, min_tokens masking, then greedy argmax, or temperature → top-k →
top-p → min-p → a draw. Draws use one generator per seeded request, so a seeded request samples the
same tokens whatever else shares its batch. Logprobs come from the model's raw distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glimmer.engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs to know about one sequence."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    # ids that may not be sampled yet (stop ids while fewer than min_tokens were generated)
    banned_ids: tuple[int, ...] = ()
    # if set, the only ids that may be sampled (a TokenController's constraint)
    allowed_ids: list[int] | None = None


@dataclass
class TokenLogprobs:
    """The chosen token's logprob and the top alternatives (id → logprob), most likely first."""

    token_id: int
    logprob: float
    top: dict[int, float]


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        p = row.params
        if not p.uses_penalties:
            continue
        device = logits.device
        out = torch.tensor(row.output_ids, dtype=torch.int64, device=device)
        out = out[out < vocab]
        if p.repetition_penalty != 1:
            seen = torch.tensor(row.prompt_ids + row.output_ids, dtype=torch.int64, device=device)
            seen = torch.unique(seen[seen < vocab])
            values = logits[i, seen]
            logits[i, seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if out.numel() and (p.frequency_penalty or p.presence_penalty):
            counts = torch.bincount(out, minlength=vocab).to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _filter(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """top-k, top-p and min-p on temperature-scaled logits; filtered entries become -inf."""
    vocab = logits.shape[1]
    device = logits.device
    top_k = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in rows], device=device)
    top_p = torch.tensor([r.params.top_p for r in rows], device=device, dtype=logits.dtype)
    min_p = torch.tensor([r.params.min_p for r in rows], device=device, dtype=logits.dtype)
    if bool((top_k >= vocab).all()) and bool((top_p >= 1).all()) and bool((min_p <= 0).all()):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)[None, :]
    drop = rank >= top_k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # keep a token if the mass strictly before it is below top_p (the first token is always kept)
    drop |= (probs.cumsum(-1) - probs) >= top_p[:, None]
    drop |= probs < min_p[:, None] * probs[:, :1]
    drop[:, 0] = False
    filtered = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, filtered)


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
    """logits: (M, V), one row per sequence that needs a token this step."""
    logits = logits.float()
    want_logprobs = any(r.params.logprobs is not None for r in rows)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None

    if any(r.params.uses_penalties or r.banned_ids or r.allowed_ids is not None for r in rows):
        logits = logits.clone()
        _apply_penalties(logits, rows)
        for i, row in enumerate(rows):
            if row.banned_ids:
                logits[i, list(row.banned_ids)] = float("-inf")
            if row.allowed_ids is not None:
                keep = torch.full_like(logits[i], float("-inf"))
                allowed = torch.tensor(row.allowed_ids, dtype=torch.int64, device=logits.device)
                keep[allowed] = logits[i, allowed]
                logits[i] = keep

    tokens = torch.empty(len(rows), dtype=torch.int64, device=logits.device)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    if random_rows:
        sub_rows = [rows[i] for i in random_rows]
        temps = torch.tensor([r.params.temperature for r in sub_rows], device=logits.device)
        scaled = _filter(logits[random_rows] / temps[:, None], sub_rows)
        probs = torch.softmax(scaled, dim=-1)
        # exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p, one generator per row
        noise = torch.empty_like(probs)
        for j, row in enumerate(sub_rows):
            noise[j].exponential_(generator=row.generator)
        tokens[random_rows] = (probs / noise).argmax(dim=-1)

    token_list = tokens.tolist()
    logprob_list: list[TokenLogprobs | None] = [None] * len(rows)
    if raw_logprobs is not None:
        for i, row in enumerate(rows):
            k = row.params.logprobs
            if k is None:
                continue
            chosen = float(raw_logprobs[i, token_list[i]])
            top: dict[int, float] = {}
            if k > 0:
                values, ids = raw_logprobs[i].topk(k)
                top = dict(zip(ids.tolist(), values.tolist(), strict=True))
            logprob_list[i] = TokenLogprobs(token_id=token_list[i], logprob=chosen, top=top)
    return SampleResult(token_ids=token_list, logprobs=logprob_list)
