"""Seeded differential fuzz of the text decoder across its config space, against transformers 5.23.

Each case draws a tiny random text config over every field the forward depends on (architecture.md §1.1,
§2): head_dim unrelated to hidden/heads, GQA ratios, sliding_window, a random full/sliding (NoPE/RoPE)
layer pattern, rope_theta, qk_scale_factor, output_multiplier, final_logit_softcapping, both eps values,
attention_bias, tie_word_embeddings and a vocabulary that is no multiple of 64; every weight is random,
norms and biases included. Each case checks:

* prefill logits of a batch of prompts (some longer than the window) against the reference forward
  without cache: max abs difference below 1e-4 in float32;
* greedy generation through the public API (LLM + SamplingParams(temperature=0)) token for token against
  the argmax of the reference forward re-run on the growing sequence (not `generate`: its cache differs from
  its own forward past the window, §12.2), with prompts longer than the window, chunked prefill (small
  max_num_batched_tokens), a shared prefix (prefix-cache hits), a mixed batch and a small KV budget
  (which preempts a request when the prompts are long);
* the same greedy tokens with GLIMMER_KERNELS=torch (every op on its plain-torch reference).

A greedy comparison skips a step whose reference top-two logits are within 1e-4 (a tie float rounding may
break either way); the fuzz fails if that leaves too few compared tokens.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from oracle import reference_model

from glimmer import LLM, SamplingParams
from glimmer.checkpoint.tiny_tokenizer import write_tiny_tokenizer
from glimmer.checkpoint.weight_layouts import CANONICAL
from glimmer.engine.model_loader import load_model
from glimmer.model.context import ForwardContext
from glimmer.tiny import (
    TinySpec,
    random_state_dict,
    save_weights,
    tiny_model_config,
    to_weight_layout,
    write_model_config_files,
)

TOLERANCE = 1e-4
TIE_MARGIN = 1e-4
NEW_TOKENS = 6


def _draw_config(rng: random.Random, tokens):
    heads = rng.choice([2, 4, 8])
    kv_heads = rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0])
    hidden = heads * rng.choice([6, 8, 10, 16])
    head_dim = rng.choice([4, 8, 12, 16, 24])
    layers = rng.randint(2, 6)
    spec = TinySpec(hidden_size=hidden, intermediate_size=rng.choice([24, 40, 96]), num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                    sliding_window=rng.randint(2, 12), max_position_embeddings=256,
                    rope_theta=10 ** rng.uniform(1, 6))
    base = tiny_model_config(tokens, spec).text
    pattern = [rng.random() < 0.35 for _ in range(layers)]  # True: a full-attention NoPE layer
    text = dataclasses.replace(
        base,
        vocab_size=tokens.vocab_size + rng.randint(0, 90),
        layer_types=tuple("full_attention" if full else "sliding_attention" for full in pattern),
        rope_layers=tuple(not full for full in pattern),
        rms_norm_eps=10 ** rng.uniform(-7, -2),
        post_norm_eps=10 ** rng.uniform(-9, -2),
        # the canonical layout holds the folded multiplier, below √head_dim (architecture.md §15.1)
        qk_scale_factor=rng.uniform(0.3, 0.95 * math.sqrt(head_dim)),
        output_multiplier=rng.uniform(0.05, 1.5),
        final_logit_softcapping=rng.uniform(1.0, 60.0),
        attention_bias=rng.random() < 0.5,
        tie_word_embeddings=rng.random() < 0.5,
    )
    return dataclasses.replace(tiny_model_config(tokens, spec), text=text)


def _write(out, seed: int):
    tokens = write_tiny_tokenizer(out)
    config = _draw_config(random.Random(seed), tokens)
    weights = to_weight_layout(random_state_dict(config, seed), config, CANONICAL)
    if config.text.tie_word_embeddings:  # a tied checkpoint stores the embedding only, as save_pretrained writes it
        del weights["lm_head.weight"]
    write_model_config_files(out, config, tokens, config_layout="canonical")
    save_weights(weights, out)
    return config, tokens


@torch.no_grad()
def _reference_greedy(reference, prompt: list[int], count: int, token_count: int) -> tuple[list[int], list[bool]]:
    """Greedy by re-running the forward without cache on the growing sequence; also whether each step's
    top two logits are a near-tie."""
    ids, out, clear = list(prompt), [], []
    for _ in range(count):
        row = reference(input_ids=torch.tensor([ids])).logits[0, -1, :token_count].float()
        top = torch.topk(row, 2).values
        clear.append((top[0] - top[1]).item() > TIE_MARGIN)
        out.append(int(row.argmax()))
        ids.append(out[-1])
    return out, clear


def _compare(expected: list[int], clear: list[bool], got: list[int]) -> int:
    """The number of tokens compared: up to (and including) the first near-tie, after which the sequences may
    rightly part."""
    compared = 0
    for want, have, is_clear in zip(expected, got, clear, strict=True):
        if not is_clear:
            break
        assert have == want
        compared += 1
    return compared


@pytest.mark.parametrize("seed", range(6))
def test_random_config_matches_reference(tmp_path, monkeypatch, same_cpu_kernels, seed):
    config, tokens = _write(tmp_path, seed)
    text = config.text
    reference = reference_model(tmp_path)
    ours = load_model(tmp_path, progress=False).model
    rng = random.Random(1000 + seed)
    window = text.sliding_window
    prompts = [[rng.randrange(3, tokens.vocab_size) for _ in range(n)] for n in (3 * window + 5, window, 7)]

    ctx = ForwardContext.without_cache([len(p) for p in prompts])
    with torch.no_grad():
        logits = ours.compute_logits(ours(torch.tensor(sum(prompts, [])), ctx))
        start = 0
        for prompt in prompts:
            expected = reference(input_ids=torch.tensor([prompt])).logits[0].float()
            got = logits[start:start + len(prompt)].float()
            start += len(prompt)
            assert got.shape == expected.shape
            difference = (got - expected).abs().max().item()
            assert difference < TOLERANCE, (seed, text, difference)

    shared = prompts[0]
    requests = [shared, shared[: 2 * window + 1] + [5, 6, 7], prompts[2]]  # the 2nd shares a prefix with the 1st
    expected = [_reference_greedy(reference, p, NEW_TOKENS, tokens.vocab_size) for p in requests]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for kernels in ("auto", "torch"):
        monkeypatch.setenv("GLIMMER_KERNELS", kernels)
        llm = LLM(str(tmp_path), device="cpu", progress=False, max_model_len=64, block_size=4,
                  max_num_batched_tokens=7, max_num_seqs=3, kv_cache_memory=_small_kv_budget(text))
        llm.generate([{"prompt_token_ids": shared}], params, use_tqdm=False)  # fills the prefix cache
        outputs = llm.generate([{"prompt_token_ids": p} for p in requests], params, use_tqdm=False)
        compared = sum(_compare(want, clear, list(out.outputs[0].token_ids))
                       for (want, clear), out in zip(expected, outputs, strict=True))
        assert compared >= NEW_TOKENS, f"too many near-ties to compare ({compared} tokens)"


def _small_kv_budget(text) -> int:
    """Bytes for about 1.1 sequences of max_model_len=64 tokens in every layer (float32 keys and values)."""
    per_token = 2 * text.num_key_value_heads * text.head_dim * 4 * text.num_hidden_layers
    return per_token * 70
