"""Muse Glimmer's vision path: the vision tower, the adapter and the projection into the text width.

architecture.md §4 is the specification. The pieces, in the order the data flows:

1. `VisionPatchEmbedder`: a bias-free Linear over each flattened (t, c, py, px) patch, plus the learned
   P×P position table resampled to the item's patch grid (bilinear, zero padding, no renormalisation).
2. `ln_pre`, then the encoder layers. Window layers attend within P×P-patch tiles of one frame; full
   layers attend within one frame. Both use a 2-D axial RoPE driven by (column, row).
3. `ln_post`, then a channel-major pixel-shuffle that folds each merge×merge block into one token.
4. `VisionAdapter` (two GELUs), the projection Linear, and the weightless fp32 perception RMSNorm
   (`project_vision_features`).

Attention never needs a mask: tokens are gathered segment by segment (a segment is one window or one
frame) and segments of equal length are batched through one `scaled_dot_product_attention` call. A
frame has at most four distinct window shapes (full, right edge, bottom edge, corner), so a batch of
images costs a handful of attention calls per layer however many windows it has, and a 16k-patch frame
runs as one unmasked call (flash / memory-efficient kernels) instead of an N×N mask.

The reference permutes all tokens into window order before the layers and back afterwards; attention is
permutation-equivariant within a segment, so keeping raster order and gathering per segment gives the
same result (architecture.md §4.3, point 3).

Parameter names are the canonical HF names relative to `model.vision_tower.` / `model.vision_adapter.`
(architecture.md §3), so a canonical state dict loads with `load_state_dict`. There are no buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glimmer.checkpoint.config import VisionConfig

# The per-layer norm1/norm2 hard-code eps 1e-5 in the reference; only ln_pre/ln_post read
# layer_norm_eps — architecture.md §1.2.
ENCODER_LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class SegmentGroup:
    """Equal-length attention segments, attended in one batched call.

    `token_index[s, j]` is the packed (raster-order) row of the j-th token of segment s. When the
    segments are a contiguous run of rows, `first_row` is set and the gather is a view.
    """

    token_index: torch.Tensor  # (num_segments, segment_length), long
    first_row: int | None

    @property
    def num_segments(self) -> int:
        return self.token_index.shape[0]

    @property
    def segment_length(self) -> int:
        return self.token_index.shape[1]


@dataclass(frozen=True)
class VisionBatchLayout:
    """Everything the tower derives from `grid_thw` alone, computed once per forward.

    All tensors are indexed by packed patch rows in the processor's order: item, frame, patch row,
    patch column (architecture.md §4.1).
    """

    grids: tuple[tuple[int, int, int], ...]
    position_taps: torch.Tensor  # (N, 4) long: rows of the position table
    position_weights: torch.Tensor  # (N, 4) fp32 bilinear weights, zero for taps off the table
    rope_cos: torch.Tensor  # (N, head_dim) fp32
    rope_sin: torch.Tensor  # (N, head_dim) fp32
    window_segments: tuple[SegmentGroup, ...]
    frame_segments: tuple[SegmentGroup, ...]
    merge_index: torch.Tensor  # (N,) long: rows in merge-block order for the pixel shuffle

    @property
    def num_patches(self) -> int:
        return self.position_taps.shape[0]


def _axis_taps_and_weights(size: int, table_side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps into a `table_side`-long axis for `size` output positions — architecture.md §4.2.

    align_corners=False: src = (i + 0.5)·P/n − 0.5. Taps outside the table get weight 0 and the other
    weight is not renormalised (grid_sample's zero padding; F.interpolate clamps instead, which differs
    at the borders for n ≠ P — pitfall 14.12).
    """
    index = torch.arange(size, dtype=torch.float32)
    src = (index + 0.5) * table_side / size - 0.5
    floor = torch.floor(src)
    raw_taps = floor.long()[:, None] + torch.arange(2)  # (size, 2): floor, floor + 1
    weights = (1 - (src[:, None] - floor[:, None] - torch.arange(2)).abs()).clamp(min=0)
    on_table = (raw_taps >= 0) & (raw_taps <= table_side - 1)
    return raw_taps.clamp(0, table_side - 1), weights * on_table


def _position_taps_for_grid(h: int, w: int, table_side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h·w, 4) table rows and fp32 weights in tap order (r0c0, r0c1, r1c0, r1c1), raster over (r, c)."""
    row_taps, row_weights = _axis_taps_and_weights(h, table_side)
    col_taps, col_weights = _axis_taps_and_weights(w, table_side)
    taps = row_taps[:, None, :, None] * table_side + col_taps[None, :, None, :]  # (h, w, 2, 2)
    weights = row_weights[:, None, :, None] * col_weights[None, :, None, :]
    return taps.reshape(h * w, 4), weights.reshape(h * w, 4)


def _rope_inverse_frequencies(config: VisionConfig) -> torch.Tensor:
    """head_dim/4 frequencies shared by both axes: theta^(−k/(head_dim/4)) — architecture.md §4.3."""
    spatial_dim = config.head_dim // 2
    exponents = torch.arange(0, spatial_dim, 2, dtype=torch.float32) / spatial_dim
    return 1.0 / (config.rope_theta**exponents)


def _rope_cos_sin(rows: torch.Tensor, cols: torch.Tensor, config: VisionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Angles [col | row | col | row] · inv_freq with 1-based coordinates — architecture.md §4.3.

    The first quarter is driven by the column (w), the second by the row (h): the reference flips its
    (h, w) position ids before use (pitfall 14.13). The +1 offset cancels in attention (RoPE is relative)
    but is kept for bit-parity with the reference's cos/sin tables.
    """
    inv_freq = _rope_inverse_frequencies(config)
    half = torch.cat(
        [(cols + 1).float()[:, None] * inv_freq, (rows + 1).float()[:, None] * inv_freq], dim=-1
    )  # (N, head_dim/2)
    angles = torch.cat([half, half], dim=-1)
    return angles.cos(), angles.sin()


def _group_segments(segment_id: torch.Tensor, segment_length: torch.Tensor) -> tuple[SegmentGroup, ...]:
    """Batch the tokens of equal-length segments together.

    Sorting (stably) by (length, segment id) makes every segment contiguous, keeps raster order inside
    it, and puts all segments of one length side by side, so each length becomes a (count, length)
    index tensor.
    """
    num_segments = int(segment_id.max()) + 1
    order = torch.argsort(segment_length * num_segments + segment_id, stable=True)
    lengths, token_counts = torch.unique_consecutive(segment_length[order], return_counts=True)
    groups = []
    start = 0
    for length, count in zip(lengths.tolist(), token_counts.tolist(), strict=True):
        rows = order[start : start + count]
        first = int(rows[0])
        contiguous = bool(torch.equal(rows, torch.arange(first, first + count)))
        groups.append(SegmentGroup(rows.view(count // length, length), first if contiguous else None))
        start += count
    return tuple(groups)


def build_vision_layout(grid_thw: torch.Tensor, config: VisionConfig, device: torch.device) -> VisionBatchLayout:
    """Derive positions, attention segments and the merge order from `grid_thw` (patch units).

    Raises ValueError if a grid is not a positive (t, h, w) with h and w multiples of merge_size.
    """
    grids = tuple((int(t), int(h), int(w)) for t, h, w in grid_thw.tolist())
    merge = config.merge_size
    window = config.pos_emb_size  # window = pos_emb_height·patch_size pixels = P patches — §4.3
    for index, (t, h, w) in enumerate(grids):
        if min(t, h, w) <= 0 or h % merge or w % merge:
            raise ValueError(
                f"grid_thw[{index}]={[t, h, w]} is invalid: t, h, w must be positive and h, w multiples of "
                f"merge_size={merge} (the image processor guarantees this)"
            )

    taps, weights, rows_all, cols_all = [], [], [], []
    window_id, window_len, frame_id, frame_len, merge_index = [], [], [], [], []
    windows_before = frames_before = rows_before = 0
    position_cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for t, h, w in grids:
        if (h, w) not in position_cache:
            position_cache[(h, w)] = _position_taps_for_grid(h, w, config.pos_emb_size)
        grid_taps, grid_weights = position_cache[(h, w)]
        # the same resampled table is added to every frame of a video — §4.2
        taps.append(grid_taps.repeat(t, 1))
        weights.append(grid_weights.repeat(t, 1))

        rows = torch.arange(h).repeat_interleave(w)
        cols = torch.arange(w).repeat(h)
        rows_all.append(rows.repeat(t))
        cols_all.append(cols.repeat(t))

        # windows: P×P tiles anchored top-left, ragged on the right and bottom edges, within one frame
        windows_down, windows_across = -(-h // window), -(-w // window)
        tile_row, tile_col = rows // window, cols // window
        tile_height = torch.clamp(h - tile_row * window, max=window)
        tile_width = torch.clamp(w - tile_col * window, max=window)
        frame_offsets = torch.arange(t).repeat_interleave(h * w)
        window_id.append(
            windows_before
            + frame_offsets * windows_down * windows_across
            + (tile_row * windows_across + tile_col).repeat(t)
        )
        window_len.append((tile_height * tile_width).repeat(t))
        windows_before += t * windows_down * windows_across

        # full attention: one segment per frame; frames of a video never attend to each other — §4.3
        frame_id.append(frames_before + frame_offsets)
        frame_len.append(torch.full((t * h * w,), h * w))
        frames_before += t

        # pixel shuffle: merged tokens in (frame, block row, block column) order, each block's
        # sub-positions in raster order — §4.5
        blocks = torch.arange(t * h * w).view(t, h // merge, merge, w // merge, merge).permute(0, 1, 3, 2, 4)
        merge_index.append(rows_before + blocks.reshape(-1))
        rows_before += t * h * w

    rope_cos, rope_sin = _rope_cos_sin(torch.cat(rows_all), torch.cat(cols_all), config)
    window_segments = _group_segments(torch.cat(window_id), torch.cat(window_len))
    frame_segments = _group_segments(torch.cat(frame_id), torch.cat(frame_len))

    def to_device(group: SegmentGroup) -> SegmentGroup:
        return SegmentGroup(group.token_index.to(device, non_blocking=True), group.first_row)

    return VisionBatchLayout(
        grids=grids,
        position_taps=torch.cat(taps).to(device, non_blocking=True),
        position_weights=torch.cat(weights).to(device, non_blocking=True),
        rope_cos=rope_cos.to(device, non_blocking=True),
        rope_sin=rope_sin.to(device, non_blocking=True),
        window_segments=tuple(to_device(g) for g in window_segments),
        frame_segments=tuple(to_device(g) for g in frame_segments),
        merge_index=torch.cat(merge_index).to(device, non_blocking=True),
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_vision_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate (N, heads, head_dim) q and k with rotate-half pairs (j, j + head_dim/2), in fp32 (§4.8)."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    q32, k32 = q.float(), k.float()
    q_rotated = q32 * cos + _rotate_half(q32) * sin
    k_rotated = k32 * cos + _rotate_half(k32) * sin
    return q_rotated.to(q.dtype), k_rotated.to(k.dtype)


def attend_within_segments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[SegmentGroup]
) -> torch.Tensor:
    """Non-causal softmax attention restricted to segments; q, k, v and the result are (N, heads, head_dim).

    Each group of equal-length segments is one unmasked `scaled_dot_product_attention` call with the
    segments as the batch dimension (scale head_dim^−1/2).
    """
    num_heads, head_dim = q.shape[1:]
    out = torch.empty_like(v)
    for group in segments:
        count, length = group.num_segments, group.segment_length
        if group.first_row is not None:
            rows = slice(group.first_row, group.first_row + count * length)
            q_g, k_g, v_g = (x[rows].view(count, length, num_heads, head_dim) for x in (q, k, v))
        else:
            q_g, k_g, v_g = (x[group.token_index] for x in (q, k, v))
        attended = F.scaled_dot_product_attention(q_g.transpose(1, 2), k_g.transpose(1, 2), v_g.transpose(1, 2))
        attended = attended.transpose(1, 2).reshape(count * length, num_heads, head_dim)
        if group.first_row is not None:
            out[rows] = attended
        else:
            out[group.token_index.reshape(-1)] = attended
    return out


class VisionPatchEmbedder(nn.Module):
    """Patch Linear plus the resampled learned position table — architecture.md §4.2."""

    def __init__(self, config: VisionConfig):
        super().__init__()
        self.patch_embedding = nn.Linear(config.patch_dim, config.hidden_size, bias=False)
        self.position_embedding_table = nn.Embedding(config.pos_emb_size**2, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor, layout: VisionBatchLayout) -> torch.Tensor:
        embeddings = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        # the reference weighs table rows by fp32 interpolation weights and sums in fp32 (§4.8); a
        # weighted embedding_bag does the same without materialising (N, 4, hidden)
        positions = F.embedding_bag(
            layout.position_taps,
            self.position_embedding_table.weight.float(),
            per_sample_weights=layout.position_weights,
            mode="sum",
        )
        return embeddings + positions.to(embeddings.dtype)


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Sequence[SegmentGroup]
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_heads, self.head_dim)
        q, k = apply_vision_rope(q, k, cos, sin)
        return self.proj(attend_within_segments(q, k, v, segments).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact erf GELU — §1.2


class VisionEncoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + mlp(norm2(x)) — architecture.md §4.4."""

    def __init__(self, config: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=ENCODER_LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=ENCODER_LAYER_NORM_EPS)
        self.attn = VisionAttention(config)
        self.mlp = VisionMLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Sequence[SegmentGroup]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    """The perception encoder: packed patches in, merged tokens out — architecture.md §4.1–4.5.

    forward(pixel_values (N, patch_dim), grid_thw (items, 3)) → (N / merge², hidden · merge²), rows in
    (item, frame, block row, block column) order, features channel-major within each merge block.
    """

    def __init__(self, config: VisionConfig):
        super().__init__()
        self.config = config
        self.patch_embedder = VisionPatchEmbedder(config)
        self.ln_pre = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(VisionEncoderLayer(config) for _ in range(config.num_hidden_layers))
        self.ln_post = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    @property
    def output_size(self) -> int:
        return self.config.hidden_size * self.config.merge_size**2

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Raises ValueError if pixel_values and grid_thw disagree on the number or width of patches."""
        config = self.config
        if grid_thw.ndim != 2 or grid_thw.shape[1] != 3:
            raise ValueError(f"grid_thw must have shape (items, 3); got {tuple(grid_thw.shape)}")
        if pixel_values.ndim != 2 or pixel_values.shape[1] != config.patch_dim:
            raise ValueError(
                f"pixel_values must have shape (patches, {config.patch_dim}); got {tuple(pixel_values.shape)}"
            )
        dtype = self.patch_embedder.patch_embedding.weight.dtype
        if grid_thw.shape[0] == 0:
            return pixel_values.new_zeros((0, self.output_size), dtype=dtype)
        layout = build_vision_layout(grid_thw, config, pixel_values.device)
        if layout.num_patches != pixel_values.shape[0]:
            raise ValueError(
                f"grid_thw describes {layout.num_patches} patches but pixel_values has {pixel_values.shape[0]} rows"
            )

        x = self.ln_pre(self.patch_embedder(pixel_values, layout))
        # the reference casts its fp32 cos/sin tables to the hidden dtype and back up to fp32 for the
        # rotation; doing the same keeps bf16 runs on the reference's numbers
        cos = layout.rope_cos.to(x.dtype).float()
        sin = layout.rope_sin.to(x.dtype).float()
        for layer, kind in zip(self.layers, config.layer_types, strict=True):
            segments = layout.window_segments if kind == "window_attention" else layout.frame_segments
            x = layer(x, cos, sin, segments)
        x = self.ln_post(x)
        return merge_patches(x, layout.merge_index, config.merge_size)


def merge_patches(x: torch.Tensor, merge_index: torch.Tensor, merge_size: int) -> torch.Tensor:
    """Channel-major pixel shuffle: feature[c·m² + (i·m + j)] = x[patch (m·R + i, m·C + j)][c] — §4.5."""
    hidden = x.shape[-1]
    blocks = x[merge_index].view(-1, merge_size * merge_size, hidden)
    return blocks.transpose(1, 2).reshape(-1, hidden * merge_size * merge_size)


class VisionAdapter(nn.Module):
    """y = GELU(fc2(GELU(fc1(x)))), no biases: the activation follows both Linears — §4.6, pitfall 14.16."""

    def __init__(self, in_features: int, hidden_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, bias=False)
        self.fc2 = nn.Linear(hidden_features, hidden_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc2(F.gelu(self.fc1(x))))


def perception_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMSNorm in fp32, cast back to x's dtype — the reference's perception_emb_norm (§4.6)."""
    x32 = x.float()
    # torch.pow(·, −0.5) rather than rsqrt, as the reference does
    return (x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + eps, -0.5)).type_as(x)


def project_vision_features(
    tower: VisionTower,
    adapter: VisionAdapter,
    projection: nn.Linear,
    pixel_values: torch.Tensor,
    grid_thw: torch.Tensor,
    *,
    perception_norm_eps: float,
) -> list[torch.Tensor]:
    """Tower → adapter → projection → perception norm, split per item into t·h·w/merge² rows.

    The rows are ready to scatter into the item's `<|patch|>` / `<|video|>` positions in order; they are
    already normalised and must not go through the text embedding norm again (§4.9).
    `perception_norm_eps` is the text config's rms_norm_eps.
    """
    features = perception_rms_norm(projection(adapter(tower(pixel_values, grid_thw))), perception_norm_eps)
    rows_per_item = (grid_thw.prod(-1) // tower.config.merge_size**2).tolist()
    return list(torch.split(features, rows_per_item))
