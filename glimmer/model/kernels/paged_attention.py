"""Causal (optionally sliding-window) GQA attention of a flat batch over the paged KV cache.

A step's queries arrive flat: N tokens of B sequences, sequence b owning rows [qsl[b], qsl[b+1]), whose
positions are the last q_len of its seq_len positions (a prefill chunk, one decode token, or several
tokens to verify). A query at position p sees the cached keys j ≤ p, with a window W only p − W < j ≤ p
(architecture.md §2.6); query head h reads key head ⌊h / group⌋ (§2.5.6). The scale is the model's
SDPA scale, 1/√head_dim; q arrives already multiplied by qk_scale_factor (§2.5.3). With `gate`, the
result is multiplied by sigmoid(gate) before it is returned (the output gate, §2.5.8).

`paged_attention_torch` is the reference: it gathers each sequence's visible blocks into a dense copy and
runs one masked `scaled_dot_product_attention`. `paged_attention_triton` reads the blocks in place through
the block table (no copy, no dense mask), one program per (query tile, KV head, KV split). A query tile
packs BLOCK_Q tokens × the group's query heads into the rows of one matrix product, so each key tile is
loaded once for the whole group. At small batch the key range is split across programs (flash-decoding)
and a second kernel merges the partial softmaxes. On the CPU, a decode step in float32 (one query per sequence)
runs `decode_attention_cpu`, a C loop over each sequence's visible keys in place (`kernels/cpu`).
`paged_attention` picks one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glimmer.model.context import ForwardContext, KVGroupView
from glimmer.model.kernels import cpu
from glimmer.model.kernels.support import launch_options, multiprocessor_count, next_power_of_2, use_triton

MAX_KV_SPLITS = 128


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    group: KVGroupView,
    ctx: ForwardContext,
    sliding_window: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """query (N, q_heads, d); caches (blocks, block_size, kv_heads, d) already holding this step's keys.

    Returns (N, q_heads · d), gated by sigmoid(gate) when gate (N, q_heads · d) is given.
    """
    if use_triton(query, key_cache) and triton_supports(query, key_cache):
        return paged_attention_triton(query, key_cache, value_cache, group, ctx, sliding_window, scale, gate)
    if ctx.one_query_per_sequence and cpu_decode_supports(query, key_cache, value_cache, gate):
        return decode_attention_cpu(query, key_cache, value_cache, group, ctx, sliding_window, scale, gate)
    return paged_attention_torch(query, key_cache, value_cache, group, ctx, sliding_window, scale, gate)


def triton_supports(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    head_dim = query.shape[-1]
    return (
        query.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and key_cache.dtype == query.dtype
        and head_dim >= 16
        and head_dim == next_power_of_2(head_dim)
        and query.shape[1] % key_cache.shape[2] == 0
        and query.stride(-1) == 1
        and key_cache.stride(-1) == 1
    )


# ---------------------------------------------------------------------------------------------------------
# Reference


def token_layout(ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
    """The (N,) sequence index and row-within-sequence of every token, computed once per step."""
    if "seq_of_token" not in ctx.derived:
        n = ctx.positions.shape[0]
        device = ctx.positions.device
        seq_of_token = torch.repeat_interleave(
            torch.arange(ctx.num_seqs, device=device), ctx.query_lens, output_size=n
        )
        ctx.derived["seq_of_token"] = seq_of_token
        ctx.derived["row_of_token"] = torch.arange(n, device=device) - ctx.query_start_loc[seq_of_token]
    return ctx.derived["seq_of_token"], ctx.derived["row_of_token"]


def to_padded(flat: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
    """(N, …) → (B, max_query_len, …), zero-filled."""
    seq_of_token, row_of_token = token_layout(ctx)
    padded = flat.new_zeros((ctx.num_seqs, ctx.max_query_len, *flat.shape[1:]))
    padded[seq_of_token, row_of_token] = flat
    return padded


def visibility_mask(ctx: ForwardContext, group: KVGroupView | None, sliding_window: int | None) -> torch.Tensor:
    """(B, 1, Tq, Tk) boolean mask shared by all layers of a group in this step.

    With a cache the keys are the group's gathered blocks; without one, each sequence's own new tokens.
    """
    key = f"mask:{sliding_window}:{group is not None}"
    if key in ctx.derived:
        return ctx.derived[key]
    if group is not None and ctx.one_query_per_sequence:
        ctx.derived[key] = decode_visibility_mask(ctx, group, sliding_window)
    else:
        ctx.derived[key] = general_visibility_mask(ctx, group, sliding_window)
    return ctx.derived[key]


def general_visibility_mask(ctx: ForwardContext, group: KVGroupView | None, sliding_window: int | None
                            ) -> torch.Tensor:
    query_pos = to_padded(ctx.positions, ctx)
    rows = torch.arange(ctx.max_query_len, device=query_pos.device)
    query_valid = rows[None, :] < ctx.query_lens[:, None]
    if group is not None:
        num_keys = group.block_tables.shape[1] * group.block_size
        key_pos = group.kv_start_pos[:, None] + torch.arange(num_keys, device=query_pos.device)[None, :]
        key_valid = key_pos < ctx.seq_lens[:, None]
    else:
        key_pos, key_valid = query_pos, query_valid
    visible = key_valid[:, None, :] & (key_pos[:, None, :] <= query_pos[:, :, None])
    if sliding_window is not None:
        visible &= key_pos[:, None, :] > query_pos[:, :, None] - sliding_window
    # padded query rows must see something, or softmax over an empty row yields NaN
    visible[:, :, 0] |= ~query_valid
    return visible[:, None, :, :]


def decode_visibility_mask(ctx: ForwardContext, group: KVGroupView, sliding_window: int | None) -> torch.Tensor:
    """`general_visibility_mask` when each sequence brings one query, at position seq_len − 1: key j is visible
    when j < seq_len (and j ≥ seq_len − W in a window). The same booleans in a third of the ops."""
    num_keys = group.block_tables.shape[1] * group.block_size
    key_pos = group.kv_start_pos[:, None] + torch.arange(num_keys, device=group.kv_start_pos.device)
    seq_lens = ctx.seq_lens[:, None]
    visible = key_pos < seq_lens
    if sliding_window is not None:
        visible &= key_pos >= seq_lens - sliding_window
    return visible[:, None, None, :]


def dense_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    ctx: ForwardContext,
    scale: float,
    gate: torch.Tensor | None,
) -> torch.Tensor:
    """SDPA of the padded queries against (B, Tk, kv_heads, d) keys/values under `mask`; flat (N, q_heads · d)."""
    out = F.scaled_dot_product_attention(
        to_padded(query, ctx).transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=query.shape[1] != keys.shape[2],
    )
    seq_of_token, row_of_token = token_layout(ctx)
    out = out.transpose(1, 2)[seq_of_token, row_of_token].reshape(query.shape[0], -1)
    # elementwise gate in the model dtype, as the reference applies it (§2.5.8)
    return out if gate is None else out * torch.sigmoid(gate)


def paged_attention_torch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    group: KVGroupView,
    ctx: ForwardContext,
    sliding_window: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    b, m = group.block_tables.shape
    num_keys, kv_row = m * key_cache.shape[1], key_cache.shape[2:]
    keys = key_cache.index_select(0, group.block_tables.reshape(-1)).view(b, num_keys, *kv_row)
    values = value_cache.index_select(0, group.block_tables.reshape(-1)).view(b, num_keys, *kv_row)
    mask = visibility_mask(ctx, group, sliding_window)
    if ctx.one_query_per_sequence:
        return decode_attention(query, keys, values, mask, scale, gate)
    return dense_attention(query, keys, values, mask, ctx, scale, gate)


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                      scale: float, gate: torch.Tensor | None) -> torch.Tensor:
    """`dense_attention` when every sequence brings one token: the flat rows are already the padded batch, so
    the same SDPA runs without scattering the queries in and gathering the outputs back (fewer ops: the CPU's
    decode step is made of small ones)."""
    b, num_q_heads, head_dim = query.shape
    out = F.scaled_dot_product_attention(
        query.view(b, 1, num_q_heads, head_dim).transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_q_heads != keys.shape[2],
    )
    out = out.transpose(1, 2).reshape(b, num_q_heads * head_dim)
    return out if gate is None else out * torch.sigmoid(gate)


# ---------------------------------------------------------------------------------------------------------
# C (the CPU's decode steps)


def cpu_decode_supports(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        gate: torch.Tensor | None) -> bool:
    b, num_q_heads, head_dim = query.shape
    return (
        query.is_contiguous()
        and key_cache.is_contiguous() and value_cache.shape == key_cache.shape and value_cache.is_contiguous()
        and key_cache.shape[3] == head_dim and num_q_heads % key_cache.shape[2] == 0
        and (gate is None or (gate.shape == (b, num_q_heads * head_dim) and gate.stride(-1) == 1))
        and cpu.runs(query, key_cache, value_cache, *([] if gate is None else [gate]))
    )


def decode_attention_cpu(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    group: KVGroupView,
    ctx: ForwardContext,
    sliding_window: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
    lib=None,
) -> torch.Tensor:
    """`paged_attention_torch` of a decode step (query b at position seq_lens[b] − 1) reading the cache in place."""
    lib = cpu.library() if lib is None else lib
    b, num_q_heads, head_dim = query.shape
    out = query.new_empty((b, num_q_heads * head_dim))
    tables = group.block_tables.to(torch.int64).contiguous()
    starts, seq_lens = group.kv_start_pos.to(torch.int64).contiguous(), ctx.seq_lens.to(torch.int64).contiguous()
    bad = lib.glimmer_decode_attention(
        query.data_ptr(), b, num_q_heads, key_cache.shape[2], head_dim, key_cache.data_ptr(), value_cache.data_ptr(),
        key_cache.shape[0], key_cache.shape[1], tables.data_ptr(), tables.shape[1], starts.data_ptr(),
        seq_lens.data_ptr(), sliding_window or 0, scale, cpu.pointer(gate), 0 if gate is None else gate.stride(0),
        out.data_ptr(), cpu.threads())
    if bad < 0:
        raise MemoryError("decode attention: no memory for the attention scores")
    if bad:
        row = bad - 1
        raise IndexError(f"decode attention: sequence {row}'s block table does not hold its keys (seq_len "
                         f"{int(seq_lens[row])}, first listed position {int(starts[row])}, {tables.shape[1]} blocks "
                         f"of {key_cache.shape[1]} listed, {key_cache.shape[0]} in the cache)")
    return out


def probe_cpu(lib) -> str | None:
    """The C kernel against the reference (cpu.library's load-time check): a full and a windowed layer, GQA 2:1,
    a sequence whose listed blocks start past position 0, and the gate."""
    generator = torch.Generator().manual_seed(0)
    key_cache, value_cache = torch.randn(2, 6, 4, 2, 8, generator=generator)
    query, gate = torch.randn(2, 4, 8, generator=generator), torch.randn(2, 32, generator=generator)
    ctx = ForwardContext(query_start_loc=torch.tensor([0, 1, 2]), seq_lens=torch.tensor([7, 13]),
                         positions=torch.tensor([6, 12]), max_query_len=1)
    group = KVGroupView(block_size=4, block_tables=torch.tensor([[3, 1, 0, 0], [5, 2, 4, 0]]),
                        kv_start_pos=torch.tensor([0, 4]), slot_mapping=torch.tensor([0, 0]))
    for window in (None, 5):
        got = decode_attention_cpu(query, key_cache, value_cache, group, ctx, window, 0.3, gate, lib=lib)
        want = paged_attention_torch(query, key_cache, value_cache, group, ctx, window, 0.3, gate)
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            return "decode_attention"
    return None


# ---------------------------------------------------------------------------------------------------------
# Triton


def kv_splits(num_query_programs: int, device: torch.device) -> int:
    """How many programs share one query tile's keys: enough programs to fill the GPU twice over.

    A function of the batch shape only (never of context lengths), so a captured graph stays valid for
    any context: each program works out its share of the keys at run time, and surplus programs exit.
    """
    want = 2 * multiprocessor_count(device.index or 0)
    if num_query_programs >= want:
        return 1
    return min(MAX_KV_SPLITS, next_power_of_2(-(-want // num_query_programs)))


def decode_tiles(num_splits: int) -> tuple[int, int]:
    """(keys per tile, pipeline stages) of a decode launch. Where the batch alone fills the GPU (one split: each
    program walks a whole context) 64-key tiles in 2 stages; where the keys are split 2–4 ways, 32-key tiles in 3
    stages (more programs resident per SM); split more ways, 64-key tiles in 3 stages. Measured on an H200 at the
    30B's heads (GQA 16:1, head_dim 128, bf16, 4 warps), µs a layer, one split, 64/2 against 32/3: batch 256 at 1.1K
    context 75.4 against 84.5 (KV at the copy rate: 70.0), at 4K 255.5 against 291.8 (260.6); batch 192 at 2K
    119.4 against 141.9; batch 140 at 1.1K 58.1 against 65.3. Batch 64 (4 splits) at 1.1K: 27.2 against 27.3, so
    32/3 stays there. (An earlier kernel measured the opposite at one split, batch 256 at 1K: 81 µs with 32/3
    against 114 with 64/2; the same sweep on the current kernel reverses it.) A function of the batch shape only,
    like the split count (CUDA graphs replay it at any context)."""
    if num_splits == 1:
        return 64, 2
    return (32, 3) if num_splits <= 4 else (64, 3)


def merge_launch(num_splits: int, head_dim: int) -> tuple[bool, int]:
    """(skip empty splits, warps) of the merge of one (token, head)'s splits. As few warps as hold its splits × head
    at up to 128 fp32 values a thread: the reduction over splits then stays within a warp instead of crossing warps
    through shared memory. Empty splits (no key in their share) are skipped above 32 splits, where a short
    context leaves most of them empty; below, their rows are read in the same load as the rest, which does not
    wait for the (max, sum) loads. Measured on an H200 at the 30B's heads, attention with its merge, µs a layer
    against one 4-warp program skipping empty splits: batch 64 at 1K context (4 splits) 28.3 vs 32.2, at 1 key 8.3
    vs 12.1; batch 32 (8 splits) 14.9 vs 19.8; batch 8 (32 splits) 9.0 vs 12.1. Batch 1 (128 splits) keeps the
    4 warps and the skipping (one warp took 15.6 against 7.4 at 1K)."""
    return num_splits > 32, min(4, max(1, num_splits * head_dim // (32 * 128)))


def wide_tiles(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether a head is too wide for the default key tiles to stay in shared memory."""
    return head_dim > 128 or (dtype == torch.float32 and head_dim > 32)


def query_tile(group_size: int, wide: bool, decode: bool) -> tuple[int, int]:
    """(rows, tokens) of one program's query tile: the tokens × the group's query heads. Prefill tiles of 128
    rows (8 tokens × 16 heads at GQA 16:1) with 8 warps: an 8K prompt's attention at the 30B's heads takes
    2.3 ms a full layer and 1.1 ms a window-2048 layer on an H200, 4.4 and 2.1 with 64."""
    block_m = max(16 if decode else 64 if wide else 128, next_power_of_2(group_size))
    return block_m, block_m // group_size


def query_tiles(num_tokens: int, num_seqs: int, block_q: int, decode: bool) -> int:
    """Query tiles of a step (the kernel grid's first dimension): one a sequence at decode, else an upper bound,
    tokens / block_q rounded up plus one a sequence; a tile past its sequence's rows exits."""
    return num_seqs if decode else -(-num_tokens // block_q) + num_seqs


def prefill_warmup_batches(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                           device: torch.device) -> list[int]:
    """Batch sizes of two-token sequences whose prefill steps, one each, launch every Triton variant a prefill
    or mixed step can need: the attention kernel split and unsplit (the split count itself is a run-time
    argument) and the merge of each split count (compiled for each power of two up to MAX_KV_SPLITS).
    `ModelRunner` runs them once at start-up, so no step in service waits for a compile: on an H200 the
    first mixed step of a 64-way batch that met a new split count stalled every request 1.7 s (30B heads)."""
    block_q = query_tile(num_q_heads // num_kv_heads, wide_tiles(head_dim, dtype), decode=False)[1]
    batches: dict[int, int] = {}
    num_seqs = 1
    while True:
        splits = kv_splits(query_tiles(2 * num_seqs, num_seqs, block_q, decode=False) * num_kv_heads, device)
        batches.setdefault(splits, num_seqs)
        if splits == 1:
            return sorted(batches.values())
        num_seqs += 1


def paged_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    group: KVGroupView,
    ctx: ForwardContext,
    sliding_window: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    from glimmer.model.kernels.jit import paged_attention as impl

    n, num_q_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    group_size = num_q_heads // num_kv_heads
    decode = ctx.max_query_len == 1
    wide = wide_tiles(head_dim, query.dtype)
    block_m, block_q = query_tile(group_size, wide, decode)
    num_seqs = ctx.num_seqs
    num_tiles = query_tiles(n, num_seqs, block_q, decode)
    if num_splits is None:
        num_splits = kv_splits(num_tiles * num_kv_heads, query.device)
    out = torch.empty((n, num_q_heads * head_dim), dtype=query.dtype, device=query.device)
    if num_splits > 1:
        partial_acc = torch.empty((num_splits, n, num_q_heads, head_dim), dtype=torch.float32, device=query.device)
        partial_max_sum = torch.empty((num_splits, n, num_q_heads, 2), dtype=torch.float32, device=query.device)
    else:
        partial_acc = partial_max_sum = out  # unused
    gate_arg = gate if gate is not None else out
    tile_n, num_stages = decode_tiles(num_splits) if decode and not wide else (32 if wide else 64, 2)
    impl.attention_tiles[(num_tiles, num_kv_heads, num_splits)](
        query, query.stride(0), query.stride(1),
        key_cache, value_cache,
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        group.block_tables, group.block_tables.stride(0),
        group.kv_start_pos, ctx.seq_lens, ctx.query_start_loc,
        out, out.stride(0), gate_arg, gate_arg.stride(0),
        partial_acc, partial_max_sum,
        num_seqs, n, num_q_heads, num_splits,
        scale * 1.4426950408889634,  # softmax in base 2
        sliding_window or 0,
        BLOCK_SIZE=key_cache.shape[1], HEAD_DIM=head_dim, GROUP=group_size, BLOCK_Q=block_q, BLOCK_M=block_m,
        TILE_N=tile_n, SPLIT=num_splits > 1, DECODE=decode, SLIDING=sliding_window is not None,
        HAS_GATE=gate is not None, IEEE=query.dtype == torch.float32,
        num_warps=4 if block_m <= 32 else 8, num_stages=num_stages, **launch_options(query),
    )
    if num_splits > 1:
        skip_empty, warps = merge_launch(num_splits, head_dim)
        impl.merge_splits[(n, num_q_heads)](
            partial_acc, partial_max_sum, out, out.stride(0), gate_arg, gate_arg.stride(0), n, num_q_heads,
            HEAD_DIM=head_dim, NUM_SPLITS=num_splits, SKIP_EMPTY=skip_empty, HAS_GATE=gate is not None,
            num_warps=warps, **launch_options(query),
        )
    return out
