"""Training the target model on the tokenized corpus.

The forward is the model's own cache-less forward (`ForwardContext.without_cache`): each conversation of a
batch is one sequence of a flat batch, attending causally (and within the sliding window on sliding
layers) to itself only — the same code that serves prefill, so the trained weights mean the same thing at
inference. The loss is next-token cross-entropy on the tokens the model generates (reasoning, calls,
answers and their framing); the logit head runs in fp32 so the softcapped logits are not rounded to bf16.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from glimmer.checkpoint.config import ModelConfig
from glimmer.model.context import ForwardContext
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration
from glimmer.train_nano.dataset import TokenizedCorpus, length_batches
from glimmer.train_nano.recipe import Recipe

logger = logging.getLogger(__name__)


@dataclass
class Batch:
    ids: torch.Tensor  # (N,) flat tokens of the batch's conversations
    trainable: torch.Tensor  # (N,) whether the assistant generates each token
    lengths: list[int]
    loss_positions: torch.Tensor  # (M,) positions whose next token the model generates
    labels: torch.Tensor  # (M,) those next tokens

    def context(self) -> ForwardContext:
        return ForwardContext.without_cache(self.lengths, self.ids.device)


class BatchSource:
    """Endless length-bucketed batches of a corpus held on the device, reshuffled every epoch."""

    def __init__(self, corpus: TokenizedCorpus, batch_tokens: int, seed: int, device: torch.device):
        self.corpus = corpus
        self.batch_tokens = batch_tokens
        self.rng = np.random.default_rng(seed)
        self.tokens = torch.from_numpy(corpus.tokens.astype(np.int64)).to(device)
        self.trainable = torch.from_numpy(corpus.trainable).to(device)
        self.device = device
        self.epoch = 0

    def batch(self, indices: np.ndarray) -> Batch:
        starts, ends = self.corpus.offsets[indices], self.corpus.offsets[indices + 1]
        flat = torch.from_numpy(np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)]))
        flat = flat.to(self.device)
        ids, trainable = self.tokens[flat], self.trainable[flat]
        # the first token of every conversation (bos) is never trainable, so a next-token flag never
        # crosses from one conversation into the next
        positions = torch.nonzero(trainable[1:]).squeeze(1)
        return Batch(ids, trainable, (ends - starts).tolist(), positions, ids[positions + 1])

    def __iter__(self) -> Iterator[Batch]:
        while True:
            for indices in length_batches(self.corpus.lengths, self.batch_tokens, self.rng):
                yield self.batch(indices)
            self.epoch += 1


def init_weights(model: MuseGlimmerForConditionalGeneration, seed: int) -> None:
    """GPT-2 style: N(0, 0.02) matrices, output projections scaled by 1/sqrt(2·layers), unit embeddings (they
    are RMS-normed anyway), neutral norms (centered norms 0, the final norm 1)."""
    generator = torch.Generator().manual_seed(seed)
    layers = model.config.text.num_hidden_layers
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
            elif parameter.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
            elif name.endswith("language_model.norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.zero_()


def new_target(config: ModelConfig, seed: int, device: torch.device) -> MuseGlimmerForConditionalGeneration:
    model = MuseGlimmerForConditionalGeneration(config)
    init_weights(model, seed)
    return model.to(device)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; plain fp32 elsewhere (CPU bf16 autocast is slower, and fp32 is the oracle)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def fp32_logits(model: MuseGlimmerForConditionalGeneration, hidden: torch.Tensor) -> torch.Tensor:
    with torch.autocast(hidden.device.type, enabled=False):
        return model.compute_logits(hidden.float())


def target_loss(model: MuseGlimmerForConditionalGeneration, batch: Batch) -> torch.Tensor:
    with autocast(batch.ids.device):
        hidden = model(batch.ids, batch.context())
    return F.cross_entropy(fp32_logits(model, hidden[batch.loss_positions]), batch.labels)


def token_accuracy(model: MuseGlimmerForConditionalGeneration, batch: Batch) -> float:
    """The share of the assistant's tokens that greedy decoding would produce, teacher-forced."""
    with torch.no_grad(), autocast(batch.ids.device):
        hidden = model(batch.ids, batch.context())
        predicted = fp32_logits(model, hidden[batch.loss_positions]).argmax(-1)
    return (predicted == batch.labels).float().mean().item()


def optimizer_for(model: torch.nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices other than the embedding table."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (decay if parameter.dim() == 2 and "embed" not in name else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if next(model.parameters()).is_cuda else {}
    return torch.optim.AdamW(groups, lr=recipe.learning_rate, betas=(0.9, 0.95), eps=1e-8, **fused)


def learning_rate(step: int, total: int, recipe: Recipe) -> float:
    """Linear warm-up, then cosine decay to min_learning_rate_ratio of the peak."""
    peak = recipe.learning_rate
    if step < recipe.warmup_steps:
        return peak * (step + 1) / recipe.warmup_steps
    progress = min(1.0, (step - recipe.warmup_steps) / max(1, total - recipe.warmup_steps))
    floor = recipe.min_learning_rate_ratio
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class LossPoint:
    step: int
    loss: float  # mean over the steps since the previous point
    learning_rate: float
    elapsed_s: float


def run_training(
    name: str,
    model: torch.nn.Module,
    batches: Iterator,
    loss_fn: Callable[[object], torch.Tensor],
    recipe: Recipe,
    *,
    steps: int,
) -> list[LossPoint]:
    """The optimizer loop shared by the target and the drafter; returns the loss curve."""
    optimizer = optimizer_for(model, recipe)
    device = next(model.parameters()).device
    curve: list[LossPoint] = []
    running = torch.zeros((), device=device)
    since_log = 0
    start = time.perf_counter()
    step = 0
    model.train()
    while step < steps:
        lr = learning_rate(step, steps, recipe)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = loss_fn(next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        running += loss.detach()
        since_log += 1
        step += 1
        if step % recipe.log_every == 0 or step == steps:
            # the mean over the steps since the last line, read once (a .item() per step would sync)
            point = LossPoint(step, running.item() / since_log, lr, time.perf_counter() - start)
            running.zero_()
            since_log = 0
            curve.append(point)
            logger.info("%s step %5d/%d  loss %.4f  lr %.2e  %.0f s", name, step, steps, point.loss, lr,
                        point.elapsed_s)
    model.eval()
    return curve
