"""The DFlash drafter (architecture.md §10.1), named as the reference's `MuseGlimmerAssistantModel` names it.

A small Llama-style decoder whose layers attend bidirectionally. It denoises one block of `block_size`
embeddings — the target's *raw* embedding rows (no embedding norm) of [anchor, mask, …, mask] — while
attending to the target's own hidden states at the committed positions (the "context"): the outputs of
the target layers `target_layer_ids`, concatenated, projected once by `encoder` (fc, then a norm) and shared
by every layer, which turns them into keys and values without its input norm. The caller turns rows 1…
of the returned hidden states into draft logits with the target's `lm_head`, raw: no output multiplier,
no softcap, not the target's final norm.

Two entry points compute the same thing:
- `forward(noise_embeds, context_hidden_states, position_ids)`: dense batches, the reference's signature
  (parity tests, training);
- `forward_paged(context_states, block_embeds, step, kv_caches)`: the engine's. A context position's
  keys and values depend on nothing but its own hidden states, so each is computed once, written into a
  paged cache, and read back by every later block of its sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glimmer.checkpoint.config import DrafterConfig
from glimmer.model.layers import GatedMLP, RotaryTable, apply_rotary

Rotary = tuple[torch.Tensor, torch.Tensor]

GATHER_BLOCKS = 4096
"""Most cache blocks `forward_paged` gathers into dense keys and values at once, per layer (a batch is attended
a few sequences at a time): at the 30B's drafter, 4,096 blocks of 16 are 134 MB of keys."""


class DrafterRMSNorm(nn.Module):
    """y = w · cast(x · rsqrt(mean(x²) + eps)): the downcast comes BEFORE the weight (Llama style), unlike
    every norm of the target (§10.1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class ContextProjection(nn.Module):
    """fc over the concatenated target hidden states, then a norm: (…, k·H) → (…, H)."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.output_norm_enc = DrafterRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, context_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.output_norm_enc(self.fc(context_hidden_states))


class DrafterAttention(nn.Module):
    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.window = config.sliding_window if sliding else None
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=False)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)
        # weighted per-head norms, before RoPE
        self.q_norm = DrafterRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = DrafterRMSNorm(config.head_dim, config.rms_norm_eps)

    def keys_values(self, rows: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values, (N, kv_heads, d), of N rows at the positions of `rotary`."""
        n = rows.shape[0]
        k = self.k_norm(self.k_proj(rows).view(n, self.num_kv_heads, self.head_dim))
        return apply_rotary(k, *rotary), self.v_proj(rows).view(n, self.num_kv_heads, self.head_dim)

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: Rotary,
        context_keys: torch.Tensor,
        context_values: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """hidden (B, T, H), normed; context keys/values (B, S, kv_heads, d); mask (B, 1, T, S + T)."""
        q, k, v = self._project(hidden, rotary)
        return self.o_proj(self._attend(q, k, v, context_keys, context_values, mask))

    def forward_paged(
        self,
        hidden: torch.Tensor,
        rotary: Rotary,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """`forward` with the context's keys/values gathered from the paged cache through block_tables (B, M),
        a few sequences at a time: at most GATHER_BLOCKS blocks are held as dense keys and values at once (256
        sequences at 130 blocks each, gathered whole, took several GB a layer at the 30B)."""
        b, width = block_tables.shape
        q, k, v = self._project(hidden, rotary)
        chunk = max(1, GATHER_BLOCKS // max(width, 1))
        outs = []
        for lo in range(0, b, chunk):
            tables = block_tables[lo : lo + chunk]
            shape = (tables.shape[0], width * key_cache.shape[1], self.num_kv_heads, self.head_dim)
            outs.append(self._attend(q[lo : lo + chunk], k[lo : lo + chunk], v[lo : lo + chunk],
                                     key_cache[tables].reshape(shape), value_cache[tables].reshape(shape),
                                     mask[lo : lo + chunk]))
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))

    def _project(self, hidden: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, T, heads, d) and the block's own keys and values (B, T, kv_heads, d), normed and rotated."""
        b, t, _ = hidden.shape
        rows = hidden.reshape(b * t, -1)
        q = self.q_norm(self.q_proj(rows).view(b * t, self.num_heads, self.head_dim))
        q = apply_rotary(q, *rotary)
        k, v = self.keys_values(rows, rotary)  # the block's own rows, after input_layernorm
        kv_shape = (b, t, self.num_kv_heads, self.head_dim)
        return q.view(b, t, self.num_heads, self.head_dim), k.view(kv_shape), v.view(kv_shape)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_keys: torch.Tensor,
                context_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The attention output (B, T, heads · d) of queries over the context's keys, then the block's own."""
        b, t = q.shape[:2]
        keys = torch.cat([context_keys, k], dim=1)
        values = torch.cat([context_values, v], dim=1)
        # grouped-query attention as one attention per key/value head over group × T query rows: query head h
        # reads key head h // group, like SDPA's enable_gqa, without expanding the keys (and on CUDA it takes a
        # fused kernel, where enable_gqa with a mask falls back to the unfused math)
        group, kv_heads, d = self.num_heads // self.num_kv_heads, self.num_kv_heads, self.head_dim
        queries = q.view(b, t, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * t, d)
        s = mask.shape[-1]
        rows_mask = mask[:, :, None].expand(b, 1, group, t, s).reshape(b, 1, group * t, s)
        out = F.scaled_dot_product_attention(queries, keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=rows_mask, scale=d**-0.5)
        out = out.view(b, kv_heads, group, t, d).permute(0, 3, 1, 2, 4)
        return out.reshape(b, t, self.num_heads * d)


class DrafterDecoderLayer(nn.Module):
    def __init__(self, config: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DrafterAttention(config, layer_idx)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = DrafterRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DrafterRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, rotary: Rotary, context_keys: torch.Tensor, context_values: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, context_keys, context_values, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_paged(self, x: torch.Tensor, rotary: Rotary, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.forward_paged(self.input_layernorm(x), rotary, key_cache, value_cache, block_tables,
                                             mask)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class DraftStep:
    """Where one engine drafter step writes new context rows and what each block reads (paged cache).

    context_positions, context_slots: (Nc,) position and cache slot (block · block_size + offset) of each
        new context row, flat over sequences.
    block_positions: (B, T) positions of the blocks' rows (the anchor's position, then the next T − 1).
    block_tables: (B, M) physical cache blocks holding block b's visible context, from position
        kv_start_pos[b] on (pad with any valid id: padding is masked).
    kv_start_pos: (B,) position of the first slot of row b's first listed block.
    context_lens: (B,) context positions < context_lens[b] exist for block b (the anchor's position).
    """

    block_size: int
    context_positions: torch.Tensor
    context_slots: torch.Tensor
    block_positions: torch.Tensor
    block_tables: torch.Tensor
    kv_start_pos: torch.Tensor
    context_lens: torch.Tensor


def _window_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, 1, T, K): bidirectional, |Δposition| <= window when there is a window (the reference's eager/sdpa
    bidirectional sliding mask is inclusive, §10.1)."""
    distance = (query_pos[:, :, None] - key_pos[:, None, :]).abs()
    allowed = torch.ones_like(distance, dtype=torch.bool) if window is None else distance <= window
    return allowed[:, None]


class DFlashDrafter(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DrafterDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DrafterRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.encoder = ContextProjection(config)
        self.rotary = RotaryTable(config.head_dim, config.rope_theta)

    def fuse_for_inference(self) -> None:
        """gate_proj and up_proj of every layer as one GEMM."""
        for layer in self.layers:
            layer.mlp.fuse_projections()

    def pack_projections(self) -> None:
        """After `fuse_for_inference`, on the CPU: the MLPs read weights packed for oneDNN, as `GatedMLP` does."""
        for layer in self.layers:
            layer.mlp.pack_projections()

    def _masks(self, make: Callable[[int | None], torch.Tensor]) -> dict[int | None, torch.Tensor]:
        """One mask per distinct window among the layers."""
        return {w: make(w) for w in {layer.self_attn.window for layer in self.layers}}

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The reference's forward without a cache: the block's last hidden states (B, T, H), final-normed.

        noise_embeds (B, T, H): raw target embeddings of [anchor, mask × (T − 1)].
        context_hidden_states (B, S, k·H): the target layers' outputs at S context positions.
        position_ids (B, S + T): the context positions, then the block's (default 0 … S + T − 1).
        attention_mask: optional bool (B, T, S + T), True where a block row may attend a key; it narrows
            the reference's mask (bidirectional, windowed on sliding layers), e.g. for training.
        """
        b, t, hidden = noise_embeds.shape
        s = context_hidden_states.shape[1]
        if position_ids is None:
            position_ids = torch.arange(s + t, device=noise_embeds.device).expand(b, -1)
        context = self.encoder(context_hidden_states).reshape(b * s, hidden)
        cos, sin = self.rotary(position_ids.reshape(-1), noise_embeds.dtype)
        cos, sin = cos.view(b, s + t, -1), sin.view(b, s + t, -1)
        context_rotary = (cos[:, :s].reshape(b * s, -1), sin[:, :s].reshape(b * s, -1))
        block_rotary = (cos[:, s:].reshape(b * t, -1), sin[:, s:].reshape(b * t, -1))
        masks = self._masks(lambda w: _window_mask(position_ids[:, s:], position_ids, w))
        if attention_mask is not None:
            masks = {w: m & attention_mask.reshape(b, 1, t, s + t) for w, m in masks.items()}
        x = noise_embeds
        for layer in self.layers:
            attn = layer.self_attn
            k, v = attn.keys_values(context, context_rotary)
            shape = (b, s, attn.num_kv_heads, attn.head_dim)
            x = layer(x, block_rotary, k.view(shape), v.view(shape), masks[attn.window])
        return self.norm(x)

    def forward_paged(
        self,
        context_states: torch.Tensor,
        block_embeds: torch.Tensor,
        step: DraftStep,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Write the keys/values of new context rows into the paged cache, then denoise the blocks.

        context_states (Nc, k·H); block_embeds (B, T, H) raw target embeddings; kv_caches per layer
        (key_cache, value_cache), each (num_blocks, block_size, kv_heads, d). Returns (B, T, H), final-normed
        (B may be 0: the step only writes context).
        """
        b, t, _ = block_embeds.shape
        context = self.encoder(context_states) if context_states.shape[0] else None
        context_rotary = self.rotary(step.context_positions, block_embeds.dtype)
        block_rotary = self.rotary(step.block_positions.reshape(-1), block_embeds.dtype)
        if b:
            width = step.block_tables.shape[1] * step.block_size
            key_pos = step.kv_start_pos[:, None] + torch.arange(width, device=block_embeds.device)[None, :]
            cached = (key_pos < step.context_lens[:, None])[:, None, None, :]
            all_pos = torch.cat([key_pos, step.block_positions], dim=1)
            block_keys = torch.ones((b, 1, 1, t), dtype=torch.bool, device=block_embeds.device)
            masks = self._masks(
                lambda w: _window_mask(step.block_positions, all_pos, w) & torch.cat([cached, block_keys], dim=-1)
            )
        x = block_embeds
        for layer, (key_cache, value_cache) in zip(self.layers, kv_caches, strict=True):
            attn = layer.self_attn
            shape = (-1, attn.num_kv_heads, attn.head_dim)
            if context is not None:
                k, v = attn.keys_values(context, context_rotary)
                key_cache.view(shape).index_copy_(0, step.context_slots, k)
                value_cache.view(shape).index_copy_(0, step.context_slots, v)
            if b:
                x = layer.forward_paged(x, block_rotary, key_cache, value_cache, step.block_tables,
                                        masks[attn.window])
        return self.norm(x)
