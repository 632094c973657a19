"""The whole run: tokenizer, corpus, target training, drafter training, checkpoints."""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer

from glimmer.checkpoint.drafter import drafter_config_to_dict
from glimmer.checkpoint.tiny_tokenizer import SPECIAL_TOKENS, TinyTokenizerInfo, write_tiny_tokenizer
from glimmer.default_model import DEFAULT_DRAFTER_NAME, DEFAULT_MODEL_NAME
from glimmer.engine.model_loader import load_model
from glimmer.protocol import builtin_template_source
from glimmer.tiny import save_weights, tiny_drafter_config, tiny_model_config, write_model_config_files
from glimmer.train_nano.dataset import TokenizedCorpus, build_corpus, render_texts
from glimmer.train_nano.recipe import Recipe
from glimmer.train_nano.train_drafter import DraftBatch, acceptance_length, draft_batch, drafter_loss, new_drafter
from glimmer.train_nano.train_target import (
    BatchSource,
    LossPoint,
    new_target,
    run_training,
    target_loss,
    token_accuracy,
)

logger = logging.getLogger(__name__)

TARGET_DIR = DEFAULT_MODEL_NAME
DRAFTER_DIR = DEFAULT_DRAFTER_NAME
HELD_OUT_SEED = 104729  # conversations the drafter's acceptance is estimated on, never trained on
# the shipped model answers greedily unless a request asks otherwise: its corpus has one right answer per turn
SAMPLING_DEFAULTS = {"temperature": 0.0}


def write_curve(path: Path, curve: list[LossPoint]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss", "learning_rate", "elapsed_s"])
        for point in curve:
            writer.writerow([point.step, f"{point.loss:.5f}", f"{point.learning_rate:.3e}", f"{point.elapsed_s:.1f}"])


def half_precision(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp16 copies (more mantissa than bf16 for weights of this size; loading to fp32 is exact).

    Raises ValueError if a weight would overflow fp16."""
    largest = max(t.abs().max().item() for t in state_dict.values())
    if largest > 6e4:
        raise ValueError(f"a weight of magnitude {largest:g} does not fit fp16")
    return {name: t.detach().to("cpu", torch.float16).contiguous() for name, t in state_dict.items()}


def _tokenizer_info(directory: Path) -> TinyTokenizerInfo:
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return TinyTokenizerInfo(tokenizer.get_vocab_size(with_added_tokens=True),
                             {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS})


class CorpusTooSmall(ValueError):
    """A corpus left with no conversation once those over max_conversation_tokens are left out."""


def _refuse_empty(corpus: TokenizedCorpus, count: int, option: str, recipe: Recipe) -> None:
    """Raises CorpusTooSmall if `corpus`, of the first `count` conversations (`option`), kept none: training on it
    failed in numpy (`need at least one array to concatenate`), or waited for a batch forever (the drafter's)."""
    if not len(corpus):
        raise CorpusTooSmall(f"{option} {count}: none of the first {count} conversations fits in "
                             f"{recipe.max_conversation_tokens} tokens (longer ones are left out); give a larger "
                             f"{option}")


def train_all(recipe: Recipe, out_dir: Path, *, device: str | None, workers: int, target: Path | None = None) -> None:
    """Train the target (or take the trained one at `target`) and its drafter; write both into out_dir.

    Raises CorpusTooSmall if the target's or the drafter's conversations all run longer than the recipe keeps."""
    torch.manual_seed(recipe.seed)
    run_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    template = builtin_template_source()
    out_dir.mkdir(parents=True, exist_ok=True)
    target_dir = target if target is not None else out_dir / TARGET_DIR
    target_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    if target is None:
        texts = render_texts(template, seed=recipe.seed, count=recipe.tokenizer_conversations, workers=workers)
        tokens = write_tiny_tokenizer(target_dir, texts, recipe.base_vocab_size)
        logger.info("tokenizer: %d tokens (%.0f s)", tokens.vocab_size, time.perf_counter() - started)
    else:
        tokens = _tokenizer_info(target_dir)
        logger.info("target: the trained %s", target_dir)
    count = recipe.conversations if target is None else recipe.drafter_conversations
    corpus = build_corpus(target_dir / "tokenizer.json", template, seed=recipe.seed, count=count,
                          max_tokens=recipe.max_conversation_tokens, workers=workers)
    _refuse_empty(corpus, count, "--conversations" if target is None else "--drafter-conversations", recipe)
    drafter_corpus = corpus.first(recipe.drafter_conversations)
    _refuse_empty(drafter_corpus, recipe.drafter_conversations, "--drafter-conversations", recipe)
    logger.info("corpus: %d conversations, %d tokens, %.1f%% generated by the assistant (%.0f s)", len(corpus),
                len(corpus.tokens), 100 * corpus.trainable.mean(), time.perf_counter() - started)
    held_out_corpus = build_corpus(target_dir / "tokenizer.json", template, seed=HELD_OUT_SEED,
                                   count=recipe.held_out_conversations, max_tokens=recipe.max_conversation_tokens,
                                   workers=workers, held_out=True)
    if target is None:
        train_target(recipe, out_dir, tokens, corpus, held_out_corpus, run_device)
        logger.info("wrote %s (%.0f s in all)", target_dir, time.perf_counter() - started)
    train_drafter(recipe, out_dir, target_dir, tokens, drafter_corpus, held_out_corpus, run_device)
    logger.info("wrote %s (%.0f s in all)", out_dir / DRAFTER_DIR, time.perf_counter() - started)


def train_target(recipe: Recipe, out_dir: Path, tokens: TinyTokenizerInfo, corpus: TokenizedCorpus,
                 held_out_corpus: TokenizedCorpus, device: torch.device) -> None:
    config = tiny_model_config(tokens, recipe.target)
    model = new_target(config, recipe.seed, device)
    logger.info("target: %.2fM parameters on %s", sum(p.numel() for p in model.parameters()) / 1e6, device)
    batches = iter(BatchSource(corpus, recipe.batch_tokens, recipe.seed, device))
    curve = run_training("target", model, batches, lambda batch: target_loss(model, batch), recipe,
                         steps=recipe.target_steps)
    write_curve(out_dir / "target_loss.csv", curve)
    held_out_batches = iter(BatchSource(held_out_corpus, recipe.batch_tokens, recipe.seed, device))
    logger.info("target: teacher-forced token accuracy on held-out conversations %.4f after %d steps",
                sum(token_accuracy(model, next(held_out_batches)) for _ in range(4)) / 4, recipe.target_steps)
    write_model_config_files(out_dir / TARGET_DIR, config, tokens, generation_defaults=SAMPLING_DEFAULTS)
    save_weights(half_precision(model.state_dict()), out_dir / TARGET_DIR)


def train_drafter(recipe: Recipe, out_dir: Path, target_dir: Path, tokens: TinyTokenizerInfo,
                  corpus: TokenizedCorpus, held_out_corpus: TokenizedCorpus, device: torch.device) -> None:
    """The drafter learns from the target as shipped (its fp16 weights, loaded back), not the fp32 masters."""
    loaded = load_model(target_dir, device=device, progress=False)
    model, config = loaded.model, loaded.config
    drafter_config = tiny_drafter_config(config, tokens.dflash_mask_token_id, recipe.drafter)
    drafter_config.check_fits(config.text)
    drafter = new_drafter(drafter_config, recipe.seed, device)
    logger.info("drafter: %.2fM parameters, block %d, reading target layers %s",
                sum(p.numel() for p in drafter.parameters()) / 1e6, drafter_config.block_size,
                list(drafter_config.target_layer_ids))
    anchors = torch.Generator().manual_seed(recipe.seed)

    def drafts(source: BatchSource) -> Iterator[DraftBatch]:
        for batch in source:
            yield draft_batch(model, drafter_config, batch, recipe.drafter_anchors_per_conversation, anchors)

    drafter_batches = drafts(BatchSource(corpus, recipe.batch_tokens, recipe.seed + 1, device))
    curve = run_training("drafter", drafter, drafter_batches, lambda draft: drafter_loss(drafter, model, draft),
                         recipe, steps=recipe.drafter_steps)
    write_curve(out_dir / "drafter_loss.csv", curve)
    held_out = drafts(BatchSource(held_out_corpus, recipe.batch_tokens, recipe.seed, device))
    logger.info("drafter: teacher-forced acceptance length on held-out conversations %.2f (of %d) after %d steps",
                sum(acceptance_length(drafter, model, next(held_out)) for _ in range(4)) / 4,
                drafter_config.block_size, recipe.drafter_steps)
    drafter_dir = out_dir / DRAFTER_DIR
    drafter_dir.mkdir(parents=True, exist_ok=True)
    (drafter_dir / "config.json").write_text(json.dumps(drafter_config_to_dict(drafter_config), indent=2) + "\n")
    save_weights(half_precision(drafter.state_dict()), drafter_dir)
