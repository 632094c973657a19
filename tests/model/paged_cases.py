"""Random paged-KV-cache steps for kernel tests: ragged batches, scattered blocks, poisoned unused slots.

A case is a batch of sequences, each with `context` cached positions and `new` query tokens (a decode
token, a prefill chunk, tokens to verify). Blocks are scattered at random over the pool; every slot no
sequence owns, and every slot past a sequence's length, holds NaN in the poisoned copy of the cache, so
a kernel that reads one gives NaN. The reference runs on the clean copy (zeros there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glimmer.model.context import ForwardContext, KVGroupView


@dataclass
class PagedCase:
    ctx: ForwardContext
    group: KVGroupView
    query: torch.Tensor
    key_cache: torch.Tensor  # clean: zeros where nothing was written
    value_cache: torch.Tensor
    poisoned_key_cache: torch.Tensor  # NaN where nothing was written
    poisoned_value_cache: torch.Tensor
    new_keys: torch.Tensor  # (N, kv_heads, d): this step's keys, already in the caches
    new_values: torch.Tensor


def make_case(
    lengths: list[tuple[int, int]],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    sliding_window: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedCase:
    """lengths: (context, new) per sequence. With a window, blocks wholly before each sequence's first query
    window are not listed (as the sliding pool releases them): its table starts at kv_start_pos."""
    gen = torch.Generator().manual_seed(seed)
    tables, starts, slots, positions = [], [], [], []
    qsl = [0]
    need = []
    for context, new in lengths:
        total = context + new
        first = max(0, context - sliding_window + 1) // block_size if sliding_window else 0
        last = -(-total // block_size)
        need.append((first, last))
    num_blocks = sum(last - first for first, last in need) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(last - first for first, last in need)
    clean_k = torch.zeros((num_blocks, block_size, num_kv_heads, head_dim))
    clean_v = torch.zeros_like(clean_k)
    written = torch.zeros((num_blocks, block_size), dtype=torch.bool)
    new_k, new_v = [], []
    for (context, new), (first, last) in zip(lengths, need, strict=True):
        blocks = [order.pop() for _ in range(first, last)]
        tables.append(blocks + [order[0] if order else 0] * (width - len(blocks)))
        starts.append(first * block_size)
        for p in range(first * block_size, context + new):
            block, offset = blocks[p // block_size - first], p % block_size
            k = torch.randn((num_kv_heads, head_dim), generator=gen)
            v = torch.randn((num_kv_heads, head_dim), generator=gen)
            clean_k[block, offset], clean_v[block, offset] = k, v
            written[block, offset] = True
            if p >= context:
                slots.append(block * block_size + offset)
                new_k.append(k)
                new_v.append(v)
        positions.extend(range(context, context + new))
        qsl.append(qsl[-1] + new)
    poison_k, poison_v = clean_k.clone(), clean_v.clone()
    poison_k[~written] = float("nan")
    poison_v[~written] = float("nan")
    n = qsl[-1]
    query = torch.randn((n, num_q_heads, head_dim), generator=gen)
    to = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    index = lambda values: torch.tensor(values, dtype=torch.int64, device=device)  # noqa: E731
    group = KVGroupView(block_size=block_size, block_tables=index(tables), kv_start_pos=index(starts),
                        slot_mapping=index(slots))
    ctx = ForwardContext(
        query_start_loc=index(qsl),
        seq_lens=index([c + q for c, q in lengths]),
        positions=index(positions),
        max_query_len=max(q for _, q in lengths),
        groups={"case": group},
    )
    return PagedCase(ctx=ctx, group=group, query=to(query), key_cache=to(clean_k), value_cache=to(clean_v),
                     poisoned_key_cache=to(poison_k), poisoned_value_cache=to(poison_v),
                     new_keys=to(torch.stack(new_k)), new_values=to(torch.stack(new_v)))
