"""Drafter training: many blocks per conversation at once are each the drafter's own single-block forward,
and each row learns the target's greedy token while the corpus follows the target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from glimmer.engine.model_loader import load_model
from glimmer.model.context import ForwardContext
from glimmer.model.drafter import DFlashDrafter
from glimmer.tiny import TinyDrafterSpec, random_drafter_state_dict, tiny_drafter_config
from glimmer.train_nano.dataset import TokenizedCorpus
from glimmer.train_nano.train_drafter import draft_batch, drafter_logits
from glimmer.train_nano.train_target import BatchSource, fp32_logits

SPEC = TinyDrafterSpec(num_hidden_layers=2, block_size=5, target_layer_ids=(1, 6, 3), sliding_window=4096)
MASK_TOKEN_ID = 7


@pytest.fixture(scope="module")
def setup(make_tiny):
    target = load_model(make_tiny(seed=4), progress=False).model
    config = tiny_drafter_config(target.config, MASK_TOKEN_ID, SPEC)
    drafter = DFlashDrafter(config)
    drafter.load_state_dict(random_drafter_state_dict(config, seed=9))
    generator = torch.Generator().manual_seed(2)
    lengths = [31, 23, 27]
    sequences = [_mostly_greedy(target, length, generator) for length in lengths]
    tokens = np.concatenate(sequences).astype(np.int32)
    trainable = torch.rand(sum(lengths), generator=generator).numpy() < 0.9
    offsets = np.cumsum([0, *lengths])
    trainable[offsets[:-1]] = False  # a conversation's first token (bos) is never generated
    corpus = TokenizedCorpus(tokens, trainable, offsets)
    batch = BatchSource(corpus, 4096, 0, torch.device("cpu")).batch(np.arange(3))
    draft = draft_batch(target, config, batch, 4, torch.Generator().manual_seed(5))
    return target, drafter, config, batch, draft


def _mostly_greedy(target, length: int, generator: torch.Generator) -> list[int]:
    """A random start, then the target's greedy tokens, with a random token at every 6th position: the
    corpus follows the target for stretches and departs from it now and then."""
    sequence = torch.randint(0, 400, (6,), generator=generator).tolist()
    while len(sequence) < length:
        if len(sequence) % 6 == 0:
            sequence.append(int(torch.randint(0, 400, (1,), generator=generator)))
            continue
        with torch.no_grad():
            hidden = target(torch.tensor(sequence), ForwardContext.without_cache([len(sequence)]))
        sequence.append(int(fp32_logits(target, hidden[-1:]).argmax()))
    return sequence


def _anchors(draft, block):
    return draft.position_ids[:, -draft.noise_ids.shape[1]:].view(draft.noise_ids.shape[0], -1, block)[:, :, 0]


def test_each_block_equals_a_single_block_forward_on_the_context_before_its_anchor(setup):
    target, drafter, config, batch, draft = setup
    block = config.block_size
    with torch.no_grad():
        together = drafter_logits(drafter, target, draft)
        anchors = _anchors(draft, block)
        for b in range(draft.noise_ids.shape[0]):
            for j in range(anchors.shape[1]):
                anchor = anchors[b, j].item()
                noise = target.embed_tokens.raw(draft.noise_ids[b, j * block : (j + 1) * block])[None]
                positions = torch.arange(anchor + block)[None]
                alone = drafter(noise, draft.context[b : b + 1, :anchor], positions)
                logits = target.lm_head(alone[0, 1:])
                assert (together[b, j] - logits).abs().max().item() < 1e-5


def test_rows_learn_the_targets_greedy_tokens_until_the_corpus_departs_from_them(setup):
    target, drafter, config, batch, draft = setup
    block = config.block_size
    with torch.no_grad():
        greedy = fp32_logits(target, target(batch.ids, ForwardContext.without_cache(batch.lengths))).argmax(-1)
    starts = np.cumsum([0, *batch.lengths])
    anchors = _anchors(draft, block)
    weighted = 0
    for b, length in enumerate(batch.lengths):
        ids = batch.ids[starts[b] : starts[b] + length]
        flags = batch.trainable[starts[b] : starts[b] + length]
        choice = greedy[starts[b] : starts[b] + length]
        for j, anchor in enumerate(anchors[b].tolist()):
            assert flags[anchor] and draft.noise_ids[b, j * block] == ids[anchor]
            assert (draft.noise_ids[b, j * block + 1 : (j + 1) * block] == MASK_TOKEN_ID).all()
            following = True
            for k in range(1, block):
                position = anchor + k
                expected = position < length and bool(flags[position]) and following
                assert (draft.weights[b, j, k - 1] > 0) == expected
                if expected:
                    assert draft.labels[b, j, k - 1] == choice[position - 1]
                    weighted += 1
                following = following and position < length and bool(ids[position] == choice[position - 1])
    assert weighted and (draft.weights[:, :, 2:] > 0).any()  # some chains run past the second row
