"""Triton kernels of `glimmer.model.kernels.pattern_counts` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl

from glimmer.model.kernels.jit import wait_for_previous_kernel


# the moved logits' capacity follows the rows' histories: specializing on it would recompile mid-serving
@triton.jit(do_not_specialize=["moved_stride", "capacity"])
def pattern_counts(Keys, Logits, Ranks, Counts, width, keys_stride, logits_stride, counts_stride,
                   Values, Temps, Moved, Filled, moved_stride, capacity,
                   BLOCK: tl.constexpr, MOVED: tl.constexpr, PDL: tl.constexpr):
    """Tokens per rank of their 16-bit key; with MOVED, a logit that is not its key's value over the row's
    temperature (moved by a penalty or bias) is appended to the row's Moved (Filled counts them) instead."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    logits = tl.load(Logits + row * logits_stride + cols, mask=mask, other=float("-inf"))
    mask = mask & (logits != float("-inf"))  # ruled out: not counted
    keys = tl.load(Keys + row * keys_stride + cols, mask=mask, other=0)
    ranks = tl.load(Ranks + (keys.to(tl.int32) & 0xFFFF), mask=mask, other=0)
    if MOVED:
        temp = tl.load(Temps + row)
        # Values holds NaN at the NaN keys' rank; a NaN logit is neither counted nor moved
        own = tl.math.div_rn(tl.load(Values + ranks, mask=mask, other=0.0), temp)
        moved = mask & (logits != own) & (logits == logits)
        mask = mask & ~moved
        slots = tl.atomic_add(Filled + row + cols * 0, tl.full([BLOCK], 1, tl.int32), mask=moved, sem="relaxed")
        tl.store(Moved + row * moved_stride + slots, logits, mask=moved & (slots < capacity))
    tl.atomic_add(Counts + row * counts_stride + ranks, tl.full([BLOCK], 1, tl.int32), mask=mask, sem="relaxed")


@triton.jit
def pattern_thresholds(Counts, Values, Temps, Floor, TopK, TopP, Out, ranks, counts_stride,
                       HAS_K: tl.constexpr, HAS_P: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr):
    """One program per row, over the ranks in chunks: the first rank whose running count reaches k, then the
    row's largest logit and the mass of what the floor keeps, then the first rank whose running mass reaches
    top_p of it."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNK)
    temp = tl.load(Temps + row)
    floor = tl.load(Floor + row)
    base = Counts + row * counts_stride
    if HAS_K:
        k = tl.load(TopK + row)
        run = tl.zeros([], tl.int32)
        kth = ranks - 1
        for start in range(0, ranks, CHUNK):
            idx = start + offs
            c = tl.load(base + idx, mask=idx < ranks, other=0)
            hit = ((run + tl.cumsum(c, axis=0)) >= k) & (idx < ranks)
            kth = tl.minimum(kth, tl.min(tl.where(hit, idx, ranks - 1), axis=0))
            run += tl.sum(c, axis=0)
        floor = tl.maximum(floor, tl.math.div_rn(tl.load(Values + kth), temp))
    if HAS_P:
        top_p = tl.load(TopP + row)
        # the ranks run from the largest value down: the first chunk that holds a token sets the row's largest
        # logit, and every chunk before it weighs nothing
        largest = tl.full([], float("-inf"), tl.float32)
        total = tl.zeros([], tl.float32)
        for start in range(0, ranks, CHUNK):
            idx = start + offs
            c = tl.load(base + idx, mask=idx < ranks, other=0)
            x = tl.math.div_rn(tl.load(Values + idx, mask=idx < ranks, other=0.0), temp)
            first = tl.min(tl.where(c > 0, idx, ranks), axis=0)
            if largest == float("-inf"):
                if first < ranks:
                    largest = tl.math.div_rn(tl.load(Values + first), temp)
            w = tl.where((c > 0) & (x >= floor), tl.exp(x - largest) * c.to(tl.float32), 0.0)
            total += tl.sum(w, axis=0)
        target = top_p * total
        run = tl.zeros([], tl.float32)
        last = ranks - 1
        for start in range(0, ranks, CHUNK):
            idx = start + offs
            c = tl.load(base + idx, mask=idx < ranks, other=0)
            x = tl.math.div_rn(tl.load(Values + idx, mask=idx < ranks, other=0.0), temp)
            w = tl.where((c > 0) & (x >= floor), tl.exp(x - largest) * c.to(tl.float32), 0.0)
            hit = ((run + tl.cumsum(w, axis=0)) >= target) & (idx < ranks)
            last = tl.minimum(last, tl.min(tl.where(hit, idx, ranks - 1), axis=0))
            run += tl.sum(w, axis=0)
        if top_p < 1:
            floor = tl.maximum(floor, tl.math.div_rn(tl.load(Values + last), temp))
    tl.store(Out + row, floor)


# the rows' width follows the step's shape: specializing on it would recompile mid-serving
@triton.jit(do_not_specialize=["width", "stride"])
def cumsum_rows(Values, Out, width, stride, CHUNK: tl.constexpr, PDL: tl.constexpr):
    """One program per row, along it in chunks: each chunk's own sums plus the last sum before it (so the sums
    run on from it: the next chunk starts from exactly that value)."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNK)
    run = tl.zeros([], tl.float32)
    for start in range(0, width, CHUNK):
        idx = start + offs
        x = tl.load(Values + row * stride + idx, mask=idx < width, other=0.0)
        sums = run + tl.cumsum(x, axis=0)
        tl.store(Out + row * stride + idx, sums, mask=idx < width)
        run = tl.sum(tl.where(offs == CHUNK - 1, sums, 0.0), axis=0)
