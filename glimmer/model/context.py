"""Per-step batch metadata carried from the model runner into the attention layers.

The model knows nothing of requests: a step is a flat run of N tokens belonging to B sequences, each
sequence contributing a contiguous slice (a prefill chunk, one decode token, or several tokens to
verify). `ForwardContext` says where each slice starts, where its keys and values live in the paged
KV cache, and which earlier positions each query may see.

Layers are split into two KV groups, each with its own block tables (architecture.md §2.6): full-attention
layers keep every block; sliding-window layers only need the blocks that overlap the last W
positions, so their block table starts at a later logical block (`kv_start_pos`). The groups' blocks come
from one pool of pages (the engine's block_pool.py); each layer's cache tensor is a view that makes a block
id index its own memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FULL = "full"
SLIDING = "sliding"
"""The KV groups' names: keys of `ForwardContext.groups`, and of the engine's block accounting."""


@dataclass
class KVGroupView:
    """How one layer group (full or sliding) reads and writes its paged cache in this step.

    block_tables: (B, max_blocks) physical block ids; row b lists the blocks holding positions
        kv_start_pos[b], kv_start_pos[b] + block_size, … (pad with any valid id: padding is masked).
    kv_start_pos: (B,) position of the first key slot of row b's first listed block.
    slot_mapping: (N,) flat cache slot (block * block_size + offset) for each new token's key/value.
    """

    block_size: int
    block_tables: torch.Tensor
    kv_start_pos: torch.Tensor
    slot_mapping: torch.Tensor


@dataclass
class ForwardContext:
    """Batch layout of one forward step.

    query_start_loc: (B + 1,) cumulative token counts: sequence b owns tokens [qsl[b], qsl[b+1]).
    seq_lens: (B,) number of positions of sequence b that exist after this step (cached + new).
    positions: (N,) absolute position of every token.
    max_query_len: the longest slice, so attention can pad without a device sync.
    kv_caches: per layer index, the (key_cache, value_cache) tensors of shape
        (num_blocks, block_size, num_kv_heads, head_dim); empty for a cache-less forward, where each
        slice attends only to itself (used by tests and one-shot scoring).
    groups: FULL and SLIDING KVGroupView, present whenever kv_caches is.
    capture_layers: decoder layer indices whose outputs (the residual stream, before the final norm)
        are recorded into `captured` — for speculative drafters that read the target's hidden states
        (`captured_outputs`).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor
    max_query_len: int
    kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    groups: dict[str, KVGroupView] = field(default_factory=dict)
    capture_layers: tuple[int, ...] = ()
    captured: dict[int, torch.Tensor] = field(default_factory=dict)
    # tensors derived from the layout once per step and shared by every layer (masks, index maps)
    derived: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def captured_outputs(self, final_hidden: torch.Tensor, num_layers: int) -> list[torch.Tensor]:
        """The outputs of `capture_layers`, in their order, after a forward; the last layer's is the
        final-normed state `final_hidden`, as the reference reports its last hidden state (§10.1)."""
        return [final_hidden if layer == num_layers - 1 else self.captured[layer] for layer in self.capture_layers]

    @property
    def num_seqs(self) -> int:
        return self.query_start_loc.numel() - 1

    @property
    def one_query_per_sequence(self) -> bool:
        """A decode step: every sequence brings exactly one token (so the flat rows are the batch's rows)."""
        return self.max_query_len == 1 and self.positions.shape[0] == self.num_seqs

    @property
    def query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]

    @classmethod
    def without_cache(cls, query_lens: list[int], device: torch.device | str = "cpu") -> ForwardContext:
        """A cache-less step where each sequence's tokens are its positions 0…len−1."""
        lens = torch.tensor(query_lens, dtype=torch.int64, device=device)
        qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int64, device=device)
        qsl[1:] = torch.cumsum(lens, 0)
        positions = torch.cat([torch.arange(n, device=device) for n in query_lens])
        return cls(
            query_start_loc=qsl,
            seq_lens=lens,
            positions=positions,
            max_query_len=max(query_lens),
        )
