"""The training side: the forward it trains is the engine's, batches cover the corpus, the schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.model_loader import load_model
from glimmer.tiny import TinySpec
from glimmer.train_nano.dataset import TokenizedCorpus, length_batches
from glimmer.train_nano.recipe import MICRO
from glimmer.train_nano.train_target import BatchSource, fp32_logits, learning_rate


def test_training_forward_equals_the_paged_inference_forward(make_tiny):
    """The logits training computes (cache-less flat batch, fp32 head) are the engine's (paged KV cache,
    prefill then decode) to 1e-5 relative in fp32, over prompts that cross the sliding window."""
    checkpoint = make_tiny(spec=TinySpec(sliding_window=16), seed=21)
    llm = LLM(str(checkpoint), progress=False)
    recorded: list[torch.Tensor] = []
    model = llm.engine.loaded.model
    compute_logits = model.compute_logits

    def record(hidden):
        logits = compute_logits(hidden)
        recorded.append(logits.clone())
        return logits

    model.compute_logits = record
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 480, (n,), generator=generator).tolist() for n in (37, 21)]
    new_tokens = 12
    outputs = []
    for prompt in prompts:  # one at a time, so each step's logits are one row
        outputs.append(llm.generate([prompt], SamplingParams(temperature=0, max_tokens=new_tokens,
                                                             ignore_eos=True))[0])
    rows = torch.cat(recorded)

    trained = load_model(checkpoint, progress=False).model
    sequences = [p + o.token_ids for p, o in zip(prompts, outputs, strict=True)]
    flat = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
    offsets = np.cumsum([0] + [len(s) for s in sequences])
    corpus = TokenizedCorpus(flat, np.ones(len(flat), dtype=bool), offsets)
    batch = BatchSource(corpus, 4096, 0, torch.device("cpu")).batch(np.arange(len(sequences)))
    with torch.no_grad():
        logits = fp32_logits(trained, trained(batch.ids, batch.context()))
    expected = []
    for sequence, prompt, start in zip(sequences, prompts, offsets, strict=False):
        # the engine's rows: the prefill's last position, then each decode step (the last token is never fed)
        expected.append(logits[start + len(prompt) - 1 : start + len(sequence) - 1])
    expected = torch.cat(expected)
    assert rows.shape == expected.shape
    # fp32 sums run in another order (one flat batch against paged blocks): observed 1.1e-5 on logits of
    # magnitude 2.6 after 8 random layers, so the bound is 1e-5 of the logits' scale
    assert (rows - expected).abs().max().item() < 1e-5 * rows.abs().max().item()


def test_batches_cover_each_conversation_once_within_the_token_budget():
    lengths = np.random.default_rng(0).integers(50, 900, size=500)
    batches = length_batches(lengths, 4096, np.random.default_rng(1))
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    assert all(len(b) * lengths[b].max() <= 4096 for b in batches)


def test_batch_labels_are_the_next_generated_tokens():
    tokens = np.arange(10, dtype=np.int32)
    trainable = np.array([0, 0, 1, 1, 0, 0, 0, 1, 1, 1], dtype=bool)
    corpus = TokenizedCorpus(tokens, trainable, np.array([0, 5, 10]))
    batch = BatchSource(corpus, 100, 0, torch.device("cpu")).batch(np.array([0, 1]))
    assert batch.lengths == [5, 5]
    assert batch.loss_positions.tolist() == [1, 2, 6, 7, 8]
    assert batch.labels.tolist() == [2, 3, 7, 8, 9]


@pytest.mark.parametrize("total", [40, 400])
def test_learning_rate_warms_up_then_decays_to_its_floor(total):
    rates = [learning_rate(step, total, MICRO) for step in range(total)]
    peak = MICRO.learning_rate
    assert rates[0] < rates[MICRO.warmup_steps - 1] == pytest.approx(peak)
    assert rates[-1] == pytest.approx(peak * MICRO.min_learning_rate_ratio, rel=0.05)
    assert all(a >= b for a, b in zip(rates[MICRO.warmup_steps:], rates[MICRO.warmup_steps + 1:], strict=False))
