"""Training the DFlash drafter on the trained target's own hidden states and greedy outputs.

At inference (architecture.md §10.3) a draft step sees the target's hidden states of the committed
positions before the anchor (the token the target just produced) and denoises one block
[anchor, mask × (block − 1)] placed at the anchor's position onward; block row k proposes the token at
anchor + k, and the target keeps the drafts that equal its own greedy choice. Training reproduces that on
the corpus, many blocks per conversation at once: anchors are drawn among the tokens the assistant
generates, each block row attends to the context before its anchor and to its own block only (the
drafter's `attention_mask`), and row k learns the target's greedy token at anchor + k as long as the
corpus tokens before it agree with the target's greedy choices (past the first disagreement the target's
greedy continuation is unknown). Rows are weighted exp(−(k − 1) / γ): an early miss ends the whole
acceptance, a late one costs little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glimmer.checkpoint.config import DrafterConfig
from glimmer.model.context import ForwardContext
from glimmer.model.drafter import DFlashDrafter
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration
from glimmer.train_nano.train_target import Batch, autocast, fp32_logits

POSITION_DECAY = 7.0  # γ of the row weights


def new_drafter(config: DrafterConfig, seed: int, device: torch.device) -> DFlashDrafter:
    """N(0, 0.02) matrices, unit norms (every drafter norm is plain-scale)."""
    drafter = DFlashDrafter(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in drafter.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
            else:
                parameter.fill_(1.0)
    return drafter.to(device)


@dataclass
class DraftBatch:
    """Blocks of B conversations, A anchors each, padded: context (B, S, k·H) of the target's layers,
    noise_ids (B, A·T), position_ids (B, S + A·T), attention_mask (B, A·T, S + A·T), labels and weights
    (B, A, T − 1) for block rows 1…T − 1."""

    context: torch.Tensor
    noise_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


def _padded(flat: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """(N, …) flat rows of consecutive sequences → (B, max length, …), zero-filled."""
    out = flat.new_zeros((len(lengths), max(lengths), *flat.shape[1:]))
    for row, piece in enumerate(torch.split(flat, lengths)):
        out[row, : len(piece)] = piece
    return out


def draft_batch(target: MuseGlimmerForConditionalGeneration, config: DrafterConfig, batch: Batch,
                anchors_per_conversation: int, generator: torch.Generator) -> DraftBatch:
    """Run the target (no grad) and lay out the blocks."""
    device = batch.ids.device
    block = config.block_size
    ctx = ForwardContext.without_cache(batch.lengths, device)
    ctx.capture_layers = tuple(config.target_layer_ids)
    with torch.no_grad(), autocast(device):
        hidden = target(batch.ids, ctx)
        greedy = fp32_logits(target, hidden).argmax(-1)
    context = _padded(torch.cat([ctx.captured[i] for i in config.target_layer_ids], dim=-1).float(), batch.lengths)
    ids = _padded(batch.ids, batch.lengths)
    greedy = _padded(greedy, batch.lengths)
    flags = _padded(batch.trainable, batch.lengths)
    b, s = ids.shape
    # a corpus token agrees with the target when it is the target's greedy choice after the tokens before it
    agrees = torch.zeros_like(flags)
    agrees[:, 1:] = ids[:, 1:] == greedy[:, :-1]

    # anchors: generated tokens, drawn without replacement (rows with fewer repeat and are weighted 0)
    candidates = flags.clone()
    candidates[:, 0] = False
    scores = torch.rand((b, s), generator=generator, device="cpu").to(device).masked_fill(~candidates, -1.0)
    top = scores.topk(min(anchors_per_conversation, s), dim=1)
    anchors, real = top.indices, top.values >= 0  # (B, A)
    a = anchors.shape[1]
    offsets = torch.arange(block, device=device)
    rows = anchors[:, :, None] + offsets  # (B, A, T) positions of each block row
    inside = rows < s
    rows_clamped = rows.clamp(max=s - 1)
    gather = lambda t: torch.gather(t, 1, rows_clamped.reshape(b, -1)).view(b, a, block)  # noqa: E731

    noise_ids = torch.full((b, a, block), config.mask_token_id, dtype=ids.dtype, device=device)
    noise_ids[:, :, 0] = torch.gather(ids, 1, anchors)
    # row k (1…T−1) learns the target's greedy token at anchor + k, predicted at anchor + k − 1
    labels = torch.gather(greedy, 1, (rows[:, :, :-1]).clamp(max=s - 1).reshape(b, -1)).view(b, a, block - 1)
    valid = (gather(flags) & inside)[:, :, 1:] & real[:, :, None]
    # the chain: corpus tokens at anchor + 1 … anchor + k − 1 all agreed with the target's greedy choices
    chain_ok = torch.ones_like(valid)
    chain_ok[:, :, 1:] = torch.cumprod(gather(agrees)[:, :, 1:-1].int(), dim=2).bool()
    row_weights = torch.exp(-torch.arange(block - 1, device=device) / POSITION_DECAY)
    weights = (valid & chain_ok).float() * row_weights

    key_positions = torch.arange(s, device=device)
    sees_context = key_positions[None, None, :] < anchors[:, :, None]  # (B, A, S)
    own_block = torch.eye(a, dtype=torch.bool, device=device).repeat_interleave(block, 1)  # (A, A·T)
    mask = torch.cat([sees_context.repeat_interleave(block, 1),
                      own_block.repeat_interleave(block, 0).expand(b, -1, -1)], dim=2)
    position_ids = torch.cat([key_positions.expand(b, -1), rows.reshape(b, -1)], dim=1)
    return DraftBatch(context, noise_ids.reshape(b, -1), position_ids, mask, labels, weights)


def drafter_logits(drafter: DFlashDrafter, target: MuseGlimmerForConditionalGeneration,
                   draft: DraftBatch) -> torch.Tensor:
    """(B, A, T − 1, vocab) raw draft logits: the target's lm_head on block rows 1… (no multiplier, no
    softcap, no target final norm — §10.1)."""
    b = draft.noise_ids.shape[0]
    a, block = draft.labels.shape[1], draft.labels.shape[2] + 1
    with autocast(draft.noise_ids.device):
        noise_embeds = target.embed_tokens.raw(draft.noise_ids)
        out = drafter(noise_embeds, draft.context, draft.position_ids, draft.attention_mask)
        rows = out.view(b, a, block, -1)[:, :, 1:]
        return target.lm_head(rows).float()


def drafter_loss(drafter: DFlashDrafter, target: MuseGlimmerForConditionalGeneration, draft: DraftBatch
                 ) -> torch.Tensor:
    logits = drafter_logits(drafter, target, draft)
    losses = F.cross_entropy(logits.flatten(0, 2), draft.labels.flatten(), reduction="none")
    return (losses * draft.weights.flatten()).sum() / draft.weights.sum().clamp(min=1e-6)


def acceptance_length(drafter: DFlashDrafter, target: MuseGlimmerForConditionalGeneration, draft: DraftBatch
                      ) -> float:
    """Mean tokens a verify step would emit on these blocks under greedy acceptance, teacher-forced: the
    accepted drafts (leading rows whose draft is the target's choice) plus the target's own token.

    Rows whose target choice is unknown (past a disagreement of the corpus) end the count, so this
    under-estimates the engine's figure."""
    with torch.no_grad():
        hits = (drafter_logits(drafter, target, draft).argmax(-1) == draft.labels) & (draft.weights > 0)
    accepted = torch.cumprod(hits.int(), dim=2).sum(dim=2).float()  # (B, A)
    anchored = draft.weights[:, :, 0] > 0
    return (accepted[anchored] + 1).mean().item() if anchored.any() else math.nan
