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

A row whose penalties or logit bias moved some logits off their pattern's value (a float32 value between
patterns) is counted with `pattern_counts_and_moved`: its tokens still at their pattern's value are counted as
above, and the moved ones' logits come back apart, sorted (at most `capacity` a row, a bound the caller knows:
the row's penalized and biased ids). Its thresholds come from the counts and the moved values merged in
descending order (`merged_thresholds_torch`): the k-th largest, or the first whose running mass reaches top_p,
of both together, as a sort of the whole row would put them, without sorting it.
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

    ranks, values = pattern_ranks(keys.dtype, keys.device)
    counts = torch.zeros((keys.shape[0], len(values) + 1), dtype=torch.int32, device=keys.device)
    _launch_counts(keys, logits, ranks, counts, values, logits, logits, counts, 0, moved_apart=False)
    return counts[:, :-1]


def _launch_counts(keys: torch.Tensor, logits: torch.Tensor, ranks: torch.Tensor, counts: torch.Tensor,
                   values: torch.Tensor, temps: torch.Tensor, moved: torch.Tensor, filled: torch.Tensor,
                   capacity: int, *, moved_apart: bool) -> None:
    """The count kernel over every row; `moved_apart`: its MOVED variant (temps, moved, filled, capacity used)."""
    from glimmer.model.kernels.jit import pattern_counts as impl

    rows, width = keys.shape
    if rows and width:
        impl.pattern_counts[(rows, -(-width // COUNT_BLOCK))](
            keys.view(torch.int16), logits, ranks, counts, width, keys.stride(0), logits.stride(0), counts.stride(0),
            values, temps, moved, filled, moved.stride(0), capacity,
            BLOCK=COUNT_BLOCK, MOVED=moved_apart, num_warps=8, **launch_options(keys))


def pattern_counts_and_moved(keys: torch.Tensor, logits: torch.Tensor, temps: torch.Tensor, capacity: int
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """keys (R, V) bfloat16 or float16, logits (R, V) float32, the temperature-scaled logits made from them, some
    moved by penalties or a bias; temps (R,) float32 → (counts (R, ranks) of the tokens whose logit is their
    key's value divided by the row's temperature, the other logits (R, capacity) float32, largest first, -inf
    after them). A -inf logit is in neither; a NaN logit is not moved (it is counted at its key, as
    `pattern_counts` counts it). `capacity`: at least the moved tokens of any row (past it, the kernel would keep
    whichever came first: the caller bounds them by the ids its penalties and bias touch, `sampler.moved_bound`)."""
    if use_triton(keys, logits, temps) and keys.stride(1) == 1 and logits.stride(1) == 1:
        return pattern_counts_and_moved_triton(keys, logits, temps, capacity)
    return pattern_counts_and_moved_torch(keys, logits, temps, capacity)


@functools.cache
def values_by_rank_and_nan(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`pattern_ranks`' values with NaN at the NaN patterns' rank: every pattern's value, indexed by its rank."""
    values = pattern_ranks(dtype, device)[1]
    return torch.cat([values, values.new_full((1,), float("nan"))])


def _moved(keys: torch.Tensor, logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """Which finite logits are not their key's value over the row's temperature (as torch divides)."""
    ranks = pattern_ranks(keys.dtype, keys.device)[0]
    own = values_by_rank_and_nan(keys.dtype, keys.device)[ranks[keys.view(torch.int16).to(torch.int32)
                                                                & (PATTERNS - 1)]] / temps[:, None]
    return (logits != own) & (logits == logits) & (logits != float("-inf"))


def pattern_counts_and_moved_torch(keys: torch.Tensor, logits: torch.Tensor, temps: torch.Tensor, capacity: int
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    moved = torch.cat([_moved(keys[part], logits[part], temps[part])
                       for part in (slice(s, s + REFERENCE_ROWS) for s in range(0, keys.shape[0], REFERENCE_ROWS))]
                      ) if keys.shape[0] else torch.zeros_like(logits, dtype=torch.bool)
    counts = pattern_counts_torch(keys, logits.masked_fill(moved, float("-inf")))
    apart = logits.masked_fill(~moved, float("-inf"))
    if capacity <= apart.shape[1]:
        apart = apart.topk(capacity, dim=-1).values if capacity else apart[:, :0]
    else:
        apart = torch.nn.functional.pad(apart.sort(dim=-1, descending=True).values,
                                        (0, capacity - apart.shape[1]), value=float("-inf"))
    return counts, apart


def pattern_counts_and_moved_triton(keys: torch.Tensor, logits: torch.Tensor, temps: torch.Tensor, capacity: int
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    ranks, values = pattern_ranks(keys.dtype, keys.device)
    rows = keys.shape[0]
    counts = torch.zeros((rows, len(values) + 1), dtype=torch.int32, device=keys.device)
    apart = torch.full((rows, max(capacity, 1)), float("-inf"), dtype=torch.float32, device=keys.device)
    filled = torch.zeros((rows,), dtype=torch.int32, device=keys.device)
    _launch_counts(keys, logits, ranks, counts, values_by_rank_and_nan(keys.dtype, keys.device), temps, apart, filled,
                   capacity, moved_apart=True)
    # the kernel appends in whatever order its programs run: sorted, the values are the same in every run
    return counts[:, :-1], apart[:, :capacity].sort(dim=-1, descending=True).values


def pattern_thresholds(counts: torch.Tensor, values: torch.Tensor, temps: torch.Tensor, floor: torch.Tensor,
                       top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                       moved: torch.Tensor | None = None) -> torch.Tensor:
    """`floor` (R,) float32 raised by each row's top-k (int64, R; a row without one: more than its tokens) and
    top-p (float32, R; 1 for a row without one), from `pattern_counts`' counts and `values` by rank; the rows'
    temperatures `temps` (float32, R). `moved`: the logits `pattern_counts_and_moved` gave apart, or None."""
    if moved is not None:
        return merged_thresholds_torch(counts, values, temps, floor, top_k, top_p, moved)
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


def merged_thresholds_torch(counts: torch.Tensor, values: torch.Tensor, temps: torch.Tensor, floor: torch.Tensor,
                            top_k: torch.Tensor | None, top_p: torch.Tensor | None, moved: torch.Tensor
                            ) -> torch.Tensor:
    """`pattern_thresholds_torch` over the counted patterns and the `moved` logits (R, M; largest first, -inf
    after them) together, in one descending order that puts a pattern before a moved logit equal to it. The
    running count or mass at a pattern is the patterns' own up to it plus the moved logits' above it, and at a
    moved logit the moved ones' up to it plus the patterns' at or above it (the same two partial sums, added
    either way); a threshold is the first of the merged order to reach k or top_p of the mass: the larger of
    the first pattern and the first moved logit to reach it."""
    scaled = values[None, :] / temps[:, None]  # each pattern's logit, row by row (descending)
    rows, last = scaled.shape[0], scaled.shape[1] - 1
    valid = moved > float("-inf")
    # moved logits above each pattern, and patterns at or above each moved logit
    above = moved.shape[1] - torch.searchsorted(moved.flip(-1).contiguous(), scaled.contiguous(), right=True)
    at_or_above = scaled.shape[1] - torch.searchsorted(scaled.flip(-1).contiguous(), moved.contiguous())
    zero = torch.zeros((rows, 1), dtype=torch.int64, device=counts.device)
    none = torch.full((rows,), float("-inf"), device=counts.device)

    def first_reaching(pattern_run: torch.Tensor, moved_run: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The larger of the first pattern and the first moved logit whose running total reaches `target` (the
        first, not the count of those below: the sums need not rise one step at a time in every rounding)."""
        reached = pattern_run >= target[:, None]
        at_pattern = torch.where(reached.any(dim=-1), reached.to(torch.int8).argmax(dim=-1), last)
        reached_moved = (moved_run >= target[:, None]) & valid
        first_moved = reached_moved.to(torch.int8).argmax(dim=-1, keepdim=True)
        pattern_value = scaled.gather(1, at_pattern[:, None])[:, 0]
        moved_value = torch.where(reached_moved.any(dim=-1), moved.gather(1, first_moved)[:, 0], none)
        # neither reached (fewer tokens than k): the last rank, -inf, as the patterns alone give it
        return torch.maximum(pattern_value, moved_value)

    def running(pattern_total: torch.Tensor, moved_total: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The merged order's running totals at each pattern and at each moved logit, from each side's own
        running totals (0 first), and the row's whole total."""
        pattern_total = torch.cat([zero.to(pattern_total.dtype), pattern_total], dim=1)
        moved_total = torch.cat([zero.to(moved_total.dtype), moved_total], dim=1)
        return (pattern_total[:, 1:] + moved_total.gather(1, above),
                moved_total[:, 1:] + pattern_total.gather(1, at_or_above), pattern_total[:, -1] + moved_total[:, -1])

    if top_k is not None:
        pattern_run, moved_run, _ = running(counts.cumsum(dim=-1), valid.cumsum(dim=-1))
        floor = torch.maximum(floor, first_reaching(pattern_run, moved_run, top_k))
    if top_p is not None:
        counted = counts > 0
        pattern_largest = torch.where(counted.any(dim=-1), scaled.gather(
            1, counted.to(torch.int8).argmax(dim=-1, keepdim=True))[:, 0], none)
        largest = torch.maximum(pattern_largest, moved[:, 0] if moved.shape[1] else none)
        largest = torch.where(largest > float("-inf"), largest, 0.0)[:, None]  # a row without tokens weighs 0
        weight = torch.exp(scaled - largest).mul_(counts)
        weight.masked_fill_(~counted | (scaled < floor[:, None]), 0)
        moved_weight = torch.exp(moved - largest).masked_fill_(~valid | (moved < floor[:, None]), 0)
        pattern_run, moved_run, total = running(cumsum_rows(weight), cumsum_rows(moved_weight))
        threshold = first_reaching(pattern_run, moved_run, top_p * total)
        floor = torch.where(top_p < 1, torch.maximum(floor, threshold), floor)
    return floor


def cumsum_rows(values: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sums along each row (float32, non-negative: masses), each row summed in an order of
    its own: a row's sums do not depend on how many rows the tensor has, nor on how wide it is past them. On a
    GPU one Triton program a row runs along it (torch's own scans pick their order by the tensor's shape: a
    one-row tensor is scanned whole by CUB, and the rows of a batch in blocks that depend on its size), else
    chunks of CHUNK (`chunked_cumsum`); the CPU's plain cumsum runs along the row once."""
    if values.device.type == "cpu":
        return values.cumsum(dim=-1)
    if use_triton(values) and values.dtype == torch.float32:
        return cumsum_rows_triton(values)
    return chunked_cumsum(values)


def cumsum_rows_triton(values: torch.Tensor) -> torch.Tensor:
    from glimmer.model.kernels.jit import pattern_counts as impl

    values = values.contiguous()
    rows, width = values.shape
    out = torch.empty_like(values)
    if rows and width:
        impl.cumsum_rows[(rows,)](values, out, width, values.stride(0), CHUNK=THRESHOLD_CHUNK, num_warps=8,
                                  **launch_options(values))
    return out


def chunked_cumsum(values: torch.Tensor) -> torch.Tensor:
    """Each chunk's own sums plus the sum of the chunks before it: the same sums as a plain cumsum, in another
    order of additions (the GPU's way where Triton is missing; its order can follow the tensor's shape)."""
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
