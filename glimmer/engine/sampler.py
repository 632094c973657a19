"""Turn a batch of next-token logits into tokens, each row under its own sampling parameters.

Order per row (as vLLM): logit bias, penalties, min_tokens masking, the grammar's token bitmask, then greedy
argmax, or temperature → min-p → top-k → top-p (on what min-p and top-k left) → a draw. Draws use one generator
per seeded request, so a seeded request samples the same tokens whatever else shares its batch. Logprobs come
from the model's raw distribution.

Everything stays on the logits' device, and the host waits for the GPU once, to read the chosen tokens
(and their logprobs): every decision that depends on the parameters is taken on the host from them.
When every row has a top-k, the candidates come from `topk` rather than a sort of the whole vocabulary.
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
    # the tokenizer's ids: logit rows from here on (a vocabulary padded to a multiple) are no token and are never
    # sampled; their logprobs stay in the raw distribution, as the reference computes it
    token_count: int | None = None


@dataclass
class TokenLogprobs:
    """The chosen token's logprob and the top alternatives (id → logprob), most likely first."""

    token_id: int
    logprob: float
    top: dict[int, float]
    rank: int | None = None  # 1 for the most likely token id of the tokenizer's (vocabulary padding rows never count)


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def _ids_on(device: torch.device, ids: list[int] | set[int]) -> torch.Tensor:
    """A host list as a device index tensor, copied without waiting for the GPU."""
    return torch.tensor(list(ids), dtype=torch.int64).to(device, non_blocking=True)


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[1]
    device = logits.device
    for i, row in enumerate(rows):
        p = row.params
        if not p.uses_penalties:
            continue
        if p.repetition_penalty != 1:
            seen = {t for t in row.prompt_ids if t < vocab} | {t for t in row.output_ids if t < vocab}
            if seen:
                index = _ids_on(device, seen)
                values = logits[i, index]
                logits[i, index] = torch.where(values > 0, values / p.repetition_penalty,
                                               values * p.repetition_penalty)
        out = [t for t in row.output_ids if t < vocab]
        if out and (p.frequency_penalty or p.presence_penalty):
            counts = torch.zeros(vocab, dtype=logits.dtype, device=device)
            counts.index_add_(0, _ids_on(device, out), torch.ones(len(out), dtype=logits.dtype, device=device))
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


# beyond this many candidates per row, a full sort is as cheap as topk
MAX_TOPK_CANDIDATES = 1024


def _filter(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """min-p, top-k, then top-p (on the distribution the first two left, renormalized), as vLLM applies them to
    temperature-scaled logits; filtered entries become -inf. (min-p compares each probability to the largest,
    a ratio no renormalization changes, so it may be read before or after top-k; top-p may not.)"""
    vocab = logits.shape[1]
    device = logits.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    if all(k == vocab for k in ks) and all(r.params.top_p >= 1 for r in rows) and all(
            r.params.min_p <= 0 for r in rows):
        return logits
    top_k = torch.tensor(ks).to(device, non_blocking=True)
    top_p = torch.tensor([r.params.top_p for r in rows], dtype=logits.dtype).to(device, non_blocking=True)
    min_p = torch.tensor([r.params.min_p for r in rows], dtype=logits.dtype).to(device, non_blocking=True)
    width = max(ks)
    if width <= MAX_TOPK_CANDIDATES:
        # every row keeps at most `width` tokens: the candidates, sorted, without sorting the vocabulary
        sorted_logits, order = logits.topk(width, dim=-1)
    else:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(sorted_logits.shape[1], device=device)[None, :]
    drop = rank >= top_k[:, None]
    # min-p: below min_p times the most likely token's probability, i.e. more than -log(min_p) below its logit
    drop |= sorted_logits < sorted_logits[:, :1] + torch.log(min_p)[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # keep a token if the mass strictly before it is below top_p (the first token is always kept)
    drop |= (probs.cumsum(-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    filtered = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, order, filtered)


def padding_start(rows: list[SamplingRow], vocab: int) -> int:
    """The first logit column that is no token of the rows' tokenizer (`vocab` when none is padding)."""
    return min((r.token_count for r in rows if r.token_count is not None), default=vocab)


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(M, ceil(V/32)) int32, bit j of word w allowing id 32w+j (llguidance's layout) → (M, V) bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def _apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    for i, row in enumerate(rows):
        if row.params.logit_bias:
            ids, biases = zip(*row.params.logit_bias.items(), strict=True)
            logits[i, _ids_on(logits.device, list(ids))] += torch.tensor(biases, dtype=logits.dtype).to(
                logits.device, non_blocking=True)


def constrain(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Logit bias, penalties, banned ids, the vocabulary's padding rows and the grammar's bitmask applied to float
    logits (a copy when any applies), in vLLM's order: the bias first, then the penalties."""
    padding_from = padding_start(rows, logits.shape[1])
    if padding_from < logits.shape[1] or any(r.params.uses_penalties or r.banned_ids or r.params.logit_bias
                                             for r in rows):
        logits = logits.clone()
        _apply_logit_bias(logits, rows)
        _apply_penalties(logits, rows)
        for i, row in enumerate(rows):
            if row.banned_ids:
                logits[i, list(row.banned_ids)] = float("-inf")
        logits[:, padding_from:] = float("-inf")
    if token_bitmask is not None:
        allowed = unpack_token_bitmask(token_bitmask.to(logits.device, non_blocking=True), logits.shape[1])
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits


def sampling_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from: temperature, then min-p, top-k, top-p."""
    temps = torch.tensor([r.params.temperature for r in rows]).to(logits.device, non_blocking=True)
    return torch.softmax(_filter(logits / temps[:, None], rows), dim=-1)


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of (unnormalized, non-negative) `probs`, each from its own generator.

    Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p / sum(p).
    """
    noise = torch.empty_like(probs)
    for j, generator in enumerate(generators):
        noise[j].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def chosen_logprobs(
    raw_logprobs: torch.Tensor, tokens: torch.Tensor, ks: list[int | None], token_count: int | None = None
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """The tokens, and each row's chosen-token logprob, rank and top-k alternatives (None where k is None), in one
    read of the device."""
    fields = logprob_tensors(raw_logprobs, tokens, ks, token_count)
    token_list, *host = (t.tolist() for t in (tokens, *fields))
    return token_list, token_logprobs(token_list, *host, ks)


def logprob_tensors(raw_logprobs: torch.Tensor, tokens: torch.Tensor, ks: list[int | None],
                    token_count: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the device: each row's chosen-token logprob, its top max(ks) logprobs and their ids, and the chosen
    token's rank. Alternatives and ranks come from the tokenizer's ids only (the first `token_count` columns): the
    rows a vocabulary is padded with are no token, though their logprobs stay in the raw distribution."""
    chosen = raw_logprobs.gather(1, tokens[:, None])[:, 0]
    real = raw_logprobs if token_count is None else raw_logprobs[:, :token_count]
    ranks = (real > chosen[:, None]).sum(dim=-1) + 1
    k_max = min(max(k or 0 for k in ks), real.shape[1])
    top_values, top_ids = real.topk(k_max, dim=-1) if k_max else (chosen[:, None], tokens[:, None])
    return chosen, top_values, top_ids, ranks


def token_logprobs(tokens: list[int], chosen: list[float], top_values: list[list[float]], top_ids: list[list[int]],
                   ranks: list[int], ks: list[int | None]) -> list[TokenLogprobs | None]:
    """`logprob_tensors`' fields, read to the host, as one entry per row (None where k is None)."""
    out: list[TokenLogprobs | None] = [None] * len(ks)
    for i, k in enumerate(ks):
        if k is None:
            continue
        top = dict(zip(top_ids[i][:k], top_values[i][:k], strict=True)) if k > 0 else {}
        out[i] = TokenLogprobs(token_id=tokens[i], logprob=chosen[i], top=top, rank=ranks[i])
    return out


def sample(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None) -> SampleResult:
    """logits: (M, V), one row per sequence that needs a token this step.

    token_bitmask: (M, ceil(V/32)) int32 of the ids each row may sample (all bits set for a free row), or None.
    """
    tokens, fields = sample_on_device(logits, rows, token_bitmask)
    return sample_result([t.tolist() for t in (tokens, *fields)], rows)


def sample_on_device(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """`sample` without reading the device: the chosen tokens, and `logprob_tensors`' fields when a row asks
    for logprobs (else none)."""
    ks = [r.params.logprobs for r in rows]
    if token_bitmask is None and all(k is None for k in ks) and all(plain_greedy(r) for r in rows):
        return greedy_tokens(logits, rows), ()
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(k is not None for k in ks) else None
    tokens = choose_tokens(logits, rows, token_bitmask)
    if raw_logprobs is None:
        return tokens, ()
    return tokens, logprob_tensors(raw_logprobs, tokens, ks, padding_start(rows, logits.shape[1]))


def sample_result(host: list[list], rows: list[SamplingRow]) -> SampleResult:
    """`sample_on_device`'s tensors, read to the host (tokens first), as a SampleResult."""
    tokens, *fields = host
    ks = [r.params.logprobs for r in rows]
    return SampleResult(token_ids=tokens,
                        logprobs=token_logprobs(tokens, *fields, ks) if fields else [None] * len(rows))


def plain_greedy(row: SamplingRow) -> bool:
    """A greedy row that nothing but the vocabulary's padding constrains (no bias, penalty or banned id)."""
    p = row.params
    return p.greedy and not (p.uses_penalties or row.banned_ids or p.logit_bias)


def greedy_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """`choose_tokens` of `plain_greedy` rows without a grammar: the argmax of the logits in their own dtype (a
    widening to float32 keeps their order) over the tokenizer's ids, read in place. The same tokens, without the
    float32 copy, the clone and the -inf fill of the padding rows (at 256 rows of the 30B's vocabulary, 0.3 GB of
    memory traffic a step)."""
    return logits[:, :padding_start(rows, logits.shape[1])].argmax(dim=-1)


def choose_tokens(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """The chosen token of each row, as a device tensor (nothing is read back): what `sample` reads."""
    logits = constrain(logits.float(), rows, token_bitmask)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    if not random_rows:
        tokens = logits.argmax(dim=-1)
    else:
        tokens = torch.empty(len(rows), dtype=torch.int64, device=logits.device)
        if greedy:
            index = _ids_on(logits.device, greedy)
            tokens[index] = logits[index].argmax(dim=-1)
        sub_rows = [rows[i] for i in random_rows]
        index = _ids_on(logits.device, random_rows)
        tokens[index] = draw(sampling_probs(logits[index], sub_rows), [r.generator for r in sub_rows])
    return tokens


def scored_token_logprobs(logits: torch.Tensor, token_ids: list[int], k: int,
                          token_count: int | None = None) -> list[TokenLogprobs]:
    """Logprobs of given tokens (prompt scoring): row i's distribution, raw as for sampled tokens, evaluated at
    `token_ids[i]`, with its rank and `k` most likely alternatives among the tokenizer's ids (the first
    `token_count` columns, as `logprob_tensors`)."""
    raw = torch.log_softmax(logits.float(), dim=-1)
    real = raw if token_count is None else raw[:, :token_count]
    targets = torch.tensor(token_ids, dtype=torch.int64, device=raw.device)
    chosen = raw.gather(1, targets[:, None])
    ranks = ((real > chosen).sum(dim=-1) + 1).tolist()
    tops: list[dict[int, float]] = [{} for _ in token_ids]
    if k > 0:
        values, ids = real.topk(min(k, real.shape[1]), dim=-1)
        tops = [dict(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return [TokenLogprobs(token_id=t, logprob=lp, top=top, rank=rank)
            for t, lp, top, rank in zip(token_ids, chosen.squeeze(1).tolist(), tops, ranks, strict=True)]
