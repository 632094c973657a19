"""The sampler's top-k and top-p thresholds without a sort, from how many tokens carry each 16-bit logit.

A bfloat16 or float16 logit is one of 65,536 bit patterns, so what a row's thresholds depend on is how many of
its tokens carry each pattern. Ranked from the largest value down, top-k's k-th largest logit is the pattern
where the running count reaches k, and top-p's threshold the pattern where the running probability mass (a
pattern's count times its probability) reaches top_p of the row's mass (`glimmer.engine.sampler._filter`).
Counting is one pass over the row; a sort of it is many.

`pattern_counts` returns (rows, ranks) int32: tokens per pattern, by rank (largest value first; NaN patterns
have no rank); a token whose scaled, filtered logit is -inf is not counted (it weighs nothing, and a top-k that
reaches no counted pattern falls to the last rank, -inf, as a sort would put the k-th token there). Counts are
integers, so the Triton kernel's atomic additions give the torch reference's counts exactly, in whatever order
they run.

`pattern_thresholds` returns each row's floor raised by its top-k and top-p. A pattern's value divided by the
row's temperature (rounded as torch divides) is exactly the logit of every token carrying it, so the
thresholds are logit values of the row. Top-p's mass is summed in another order than a sort's cumulative sum
(and in another one by the kernel than by the reference); where the mass reaches top_p within float32 rounding,
the three may choose neighbouring thresholds.
"""

from __future__ import annotations

import functools

import torch

from glimmer.model.kernels.support import launch_options, use_triton

PATTERNS = 1 << 16
COUNT_BLOCK = 2048
REFERENCE_ROWS = 64  # rows the torch reference counts at a time
CHUNK = 1024  # the torch reference's chunked cumulative sums
THRESHOLD_CHUNK = 4096  # ranks a step of the thresholds kernel's loops


@functools.cache
def pattern_ranks(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank of each of the 65,536 patterns, int32, NaNs at the extra rank len(values)), (the values by rank,
    float32: both 16-bit formats widen exactly). Ties (+0, -0) keep pattern order."""
    values = torch.arange(PATTERNS, dtype=torch.int32).to(torch.int16).view(dtype).float()
    numbers = torch.nonzero(~values.isnan()).squeeze(1)
    order = numbers[torch.argsort(values[numbers], descending=True, stable=True)]
    ranks = torch.full((PATTERNS,), len(order), dtype=torch.int32)
    ranks[order] = torch.arange(len(order), dtype=torch.int32)
    return ranks.to(device), values[order].to(device)


def pattern_counts(keys: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """keys (R, V) bfloat16 or float16, logits (R, V) float32 (-inf where a token is ruled out) → (R, ranks)."""
    if use_triton(keys, logits) and keys.stride(1) == 1 and logits.stride(1) == 1:
        return pattern_counts_triton(keys, logits)
    return pattern_counts_torch(keys, logits)


def pattern_counts_torch(keys: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    ranks, values = pattern_ranks(keys.dtype, keys.device)
    counts = torch.zeros((keys.shape[0], len(values) + 1), dtype=torch.int32, device=keys.device)
    for start in range(0, keys.shape[0], REFERENCE_ROWS):  # bounds the int64 indices' memory
        part = slice(start, start + REFERENCE_ROWS)
        patterns = keys[part].view(torch.int16).to(torch.int32) & (PATTERNS - 1)
        index = ranks[patterns].masked_fill_(logits[part] == float("-inf"), len(values)).to(torch.int64)
        ones = torch.ones((1, 1), dtype=torch.int32, device=keys.device).expand_as(index)
        counts[part].scatter_add_(1, index, ones)  # the last column (NaNs, -inf logits) is cut off
    return counts[:, :-1]


def pattern_counts_triton(keys: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    from glimmer.model.kernels.jit import pattern_counts as impl

    ranks, values = pattern_ranks(keys.dtype, keys.device)
    rows, width = keys.shape
    counts = torch.zeros((rows, len(values) + 1), dtype=torch.int32, device=keys.device)
    if rows and width:
        impl.pattern_counts[(rows, -(-width // COUNT_BLOCK))](
            keys.view(torch.int16), logits, ranks, counts, width, keys.stride(0), logits.stride(0), counts.stride(0),
            BLOCK=COUNT_BLOCK, num_warps=8, **launch_options(keys))
    return counts[:, :-1]


def pattern_thresholds(counts: torch.Tensor, values: torch.Tensor, temps: torch.Tensor, floor: torch.Tensor,
                       top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """`floor` (R,) float32 raised by each row's top-k (int64, R; a row without one: more than its tokens) and
    top-p (float32, R; 1 for a row without one), from `pattern_counts`' counts and `values` by rank; the rows'
    temperatures `temps` (float32, R)."""
    if use_triton(counts, values, temps, floor):
        return pattern_thresholds_triton(counts, values, temps, floor, top_k, top_p)
    return pattern_thresholds_torch(counts, values, temps, floor, top_k, top_p)


def pattern_thresholds_torch(counts: torch.Tensor, values: torch.Tensor, temps: torch.Tensor, floor: torch.Tensor,
                             top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    scaled = values[None, :] / temps[:, None]  # each pattern's logit, row by row
    last = scaled.shape[1] - 1
    if top_k is not None:
        kth = (counts.cumsum(dim=-1) < top_k[:, None]).sum(dim=-1).clamp_(max=last)
        floor = torch.maximum(floor, scaled.gather(1, kth[:, None])[:, 0])
    if top_p is not None:
        largest = scaled.gather(1, (counts == 0).to(torch.int8).argmin(dim=-1, keepdim=True))
        # a pattern no token carries may lie above the row's largest logit (its weight would be inf · 0)
        weight = torch.exp(scaled - largest).mul_(counts)
        weight.masked_fill_((counts == 0) | (scaled < floor[:, None]), 0)
        mass = cumsum_rows(weight)
        reached = (mass < top_p[:, None] * mass[:, -1:]).sum(dim=-1).clamp_(max=last)
        floor = torch.where(top_p < 1, torch.maximum(floor, scaled.gather(1, reached[:, None])[:, 0]), floor)
    return floor


def cumsum_rows(values: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sums along each row; on a GPU in chunks of CHUNK (`chunked_cumsum`), so that a row's
    sums do not depend on how many rows the tensor has (torch's GPU scan picks its way by shape); the CPU's plain
    cumsum runs along the row once, faster than the chunks."""
    return values.cumsum(dim=-1) if values.device.type == "cpu" else chunked_cumsum(values)


def chunked_cumsum(values: torch.Tensor) -> torch.Tensor:
    """Each chunk's own sums plus the sum of the chunks before it: the same sums as a plain cumsum, in another
    order of additions."""
    rows, width = values.shape
    chunks = -(-width // CHUNK)
    padded = torch.nn.functional.pad(values, (0, chunks * CHUNK - width)).view(rows, chunks, CHUNK)
    inner = padded.cumsum(dim=-1)
    before = inner[:, :, -1].cumsum(dim=-1) - inner[:, :, -1]
    return (inner + before[:, :, None]).view(rows, -1)[:, :width]


def pattern_thresholds_triton(counts: torch.Tensor, values: torch.Tensor, temps: torch.Tensor, floor: torch.Tensor,
                              top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    from glimmer.model.kernels.jit import pattern_counts as impl

    rows, ranks = counts.shape
    out = torch.empty_like(floor)
    if rows:
        impl.pattern_thresholds[(rows,)](
            counts, values, temps, floor, floor if top_k is None else top_k, floor if top_p is None else top_p, out,
            ranks, counts.stride(0), HAS_K=top_k is not None, HAS_P=top_p is not None, CHUNK=THRESHOLD_CHUNK,
            num_warps=8, **launch_options(counts))
    return out
