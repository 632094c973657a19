"""Triton kernels of `glimmer.model.kernels.paged_attention` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl

from glimmer.model.kernels.jit import wait_for_previous_kernel


@triton.jit
def _store_output(Out, stride_on, Gate, stride_gn, acc, tokens, heads, offs_d, rows_valid,
                  HEAD_DIM: tl.constexpr, HAS_GATE: tl.constexpr):
    """Round to the model dtype, then gate as the reference does: o · sigmoid(g), each op rounded."""
    dtype = Out.dtype.element_ty
    cols = heads[:, None] * HEAD_DIM + offs_d[None, :]
    o = acc.to(dtype)
    if HAS_GATE:
        g = tl.load(Gate + tokens[:, None] * stride_gn + cols, mask=rows_valid[:, None], other=0.0)
        g = tl.sigmoid(g.to(tl.float32)).to(dtype)
        o = (o.to(tl.float32) * g.to(tl.float32)).to(dtype)
    tl.store(Out + tokens[:, None] * stride_on + cols, o, mask=rows_valid[:, None])


# batch-shape integers vary step to step: specializing on them (== 1, % 16) would recompile mid-serving
@triton.jit(do_not_specialize=["stride_t", "num_seqs", "num_tokens", "num_splits"])
def attention_tiles(
    Q, stride_qn, stride_qh,
    KCache, VCache, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    Tables, stride_t,
    KvStart, SeqLens, QueryStart,
    Out, stride_on, Gate, stride_gn,
    PartialAcc, PartialMaxSum,
    num_seqs, num_tokens, num_q_heads, num_splits,
    scale_log2e,
    window,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, SPLIT: tl.constexpr, DECODE: tl.constexpr,
    SLIDING: tl.constexpr, HAS_GATE: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    tile_id = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE:
        seq = tile_id
        tile = 0
    else:
        # tiles of sequence b start at qsl[b] // BLOCK_Q + b (an upper bound on the tiles before it)
        lo = tile_id * 0  # tensors from the start: loop-carried values keep their type
        hi = lo + num_seqs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            starts_before = tl.load(QueryStart + mid).to(tl.int32) // BLOCK_Q + mid <= tile_id
            lo = tl.where(starts_before, mid, lo)
            hi = tl.where(starts_before, hi, mid)
        seq = lo
        tile = tile_id - (tl.load(QueryStart + seq).to(tl.int32) // BLOCK_Q + seq)
    # positions and key indices in int32 (the engine's step metadata is int64): per-key int64 index math
    # (division, modulo, compares on every key of a tile) took a 256-row decode layer from 76 to ~120 us
    q_begin = tl.load(QueryStart + seq).to(tl.int32)
    q_len = tl.load(QueryStart + seq + 1).to(tl.int32) - q_begin
    row0 = tile * BLOCK_Q
    if row0 >= q_len:
        return
    seq_len = tl.load(SeqLens + seq).to(tl.int32)
    context_len = seq_len - q_len
    kv_start = tl.load(KvStart + seq).to(tl.int32)

    offs_m = tl.arange(0, BLOCK_M)
    rows = row0 + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    rows_valid = (offs_m < BLOCK_Q * GROUP) & (rows < q_len)
    tokens = (q_begin + rows).to(tl.int64)  # row offsets of Q/Out/Gate may pass 2^31 elements
    q_pos = context_len + rows
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + tokens[:, None] * stride_qn + heads[:, None] * stride_qh + offs_d[None, :],
                mask=rows_valid[:, None], other=0.0)

    # keys this tile can see: [lo, hi), then this program's share of them
    hi = context_len + tl.minimum(row0 + BLOCK_Q, q_len)
    lo = kv_start
    if SLIDING:
        lo = tl.maximum(lo, context_len + row0 - window + 1)
    share = tl.cdiv(tl.cdiv(hi - lo, num_splits), TILE_N) * TILE_N
    split_lo = lo + split * share
    split_hi = tl.minimum(split_lo + share, hi)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start in range(split_lo, split_hi, TILE_N):
        offs_n = start + tl.arange(0, TILE_N)
        n_valid = offs_n < split_hi
        block = tl.load(Tables + seq * stride_t + (offs_n - kv_start) // BLOCK_SIZE, mask=n_valid, other=0)
        block = block.to(tl.int64)
        slot = offs_n % BLOCK_SIZE
        k = tl.load(KCache + block[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
                    + offs_d[None, :], mask=n_valid[:, None], other=0.0)
        v = tl.load(VCache + block[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                    + offs_d[None, :], mask=n_valid[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale_log2e
        visible = n_valid[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if SLIDING:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if not SPLIT:
        acc = acc / l_i[:, None]
        _store_output(Out, stride_on, Gate, stride_gn, acc, tokens, heads, offs_d, rows_valid, HEAD_DIM, HAS_GATE)
    else:
        where = (split * num_tokens + tokens) * num_q_heads + heads
        tl.store(PartialAcc + where[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=rows_valid[:, None])
        tl.store(PartialMaxSum + where * 2, m_i, mask=rows_valid)
        tl.store(PartialMaxSum + where * 2 + 1, l_i, mask=rows_valid)


@triton.jit(do_not_specialize=["num_tokens"])
def merge_splits(
    PartialAcc, PartialMaxSum, Out, stride_on, Gate, stride_gn, num_tokens, num_q_heads,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, SKIP_EMPTY: tl.constexpr, HAS_GATE: tl.constexpr,
    PDL: tl.constexpr,
):
    """One (token, head): combine the splits' (max, sum, acc) into the softmax-weighted output."""
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    where = (offs_s * num_tokens + token) * num_q_heads + head
    m = tl.load(PartialMaxSum + where * 2)
    l_s = tl.load(PartialMaxSum + where * 2 + 1)
    acc_ptrs = PartialAcc + where[:, None] * HEAD_DIM + offs_d[None, :]
    if SKIP_EMPTY:
        # a split that saw no key left l = 0 and acc = 0: skipping its row changes no bit, and with many splits
        # reads only those a short context reaches (the split count is fixed by the batch shape, for CUDA graphs)
        acc = tl.load(acc_ptrs, mask=(l_s > 0)[:, None], other=0.0)
    else:  # with few splits, one load issued beside the (max, sum) loads instead of one waiting for them
        acc = tl.load(acc_ptrs)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(m - m_safe)
    total = tl.sum(weight * l_s, 0)
    o = tl.sum(acc * weight[:, None], 0) / total
    tokens = tl.full((1,), 0, tl.int32) + token
    heads = tl.full((1,), 0, tl.int32) + head
    valid = tl.full((1,), 1, tl.int1)
    _store_output(Out, stride_on, Gate, stride_gn, o[None, :], tokens, heads, offs_d, valid, HEAD_DIM, HAS_GATE)
