"""Triton kernel of `glimmer.model.kernels.exponential` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice
from triton.language.random import philox


@triton.jit
def exponential_rows(Out, Seeds, Offsets, width, threads, BLOCK: tl.constexpr):
    """Row r of Out (rows, width) float32: what torch's CUDA `exponential_` writes into a contiguous tensor of
    `width` elements with a generator at (Seeds[r], Offsets[r]). Its kernel runs `threads` threads (blocks of 256
    capped at the GPU's resident blocks); thread t seeds Philox4x32-10 with key = seed, counter = (offset / 4,
    t); its k-th draw of four words covers elements t + threads · (4k + i), i = 0..3. Each word x becomes the
    uniform x · 2^-32 + 2^-33 in (0, 1], then -log(u), with -log(u) = 2^-24 where u ≥ 1 - 2^-24 (torch's
    guard against a zero)."""
    row = tl.program_id(0)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    seed = tl.load(Seeds + row)
    offset = tl.load(Offsets + row)
    lap = cols // threads
    counter = offset // 4 + lap // 4
    word = lap % 4
    zero = tl.zeros([BLOCK], dtype=tl.uint32)
    c0 = (counter & 0xFFFFFFFF).to(tl.uint32)
    c1 = (counter >> 32).to(tl.uint32)
    c2 = (cols % threads).to(tl.uint32)
    x0, x1, x2, x3 = philox(seed, c0, c1, c2, zero)
    x = tl.where(word == 0, x0, tl.where(word == 1, x1, tl.where(word == 2, x2, x3)))
    tl.store(Out + row.to(tl.int64) * width + cols, exponential_of(x.to(tl.float32)), mask=mask)


@triton.jit
def exponential_of(word):
    """A Philox word (as float32, rounded to nearest) → the exponential variate torch makes of it."""
    u = word * 2.3283064365386963e-10 + 1.1641532182693481e-10
    log = tl.where(u >= 0.9999999403953552, -5.960464477539063e-08, libdevice.log(u))
    return -log


@triton.jit
def exponential_of_words(Words, Out, count, BLOCK: tl.constexpr):
    """`exponential_of` over given float32 words (the probe's check of every word's float value)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < count
    tl.store(Out + offs, exponential_of(tl.load(Words + offs, mask=mask, other=0.0)), mask=mask)
