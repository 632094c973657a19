"""Seeded differential fuzz of the text decoder across its config space, against transformers 5.23.

Each case draws a tiny random text config over every field the forward depends on (architecture.md §1.1,
§2): head_dim unrelated to hidden/heads, GQA ratios, sliding_window, a random full/sliding layer pattern and
a NoPE pattern that mostly follows it (full attention with RoPE and sliding windows without it included),
rope_theta, qk_scale_factor, output_multiplier, final_logit_softcapping, both eps values, attention_bias,
tie_word_embeddings and a vocabulary that is no multiple of 64; every weight is random, norms and biases
included. Each case checks:

* prefill logits of a batch of prompts (some longer than the window) against the reference forward
  without cache: max abs difference below 1e-4 in float32;
* greedy generation through the public API (LLM + SamplingParams(temperature=0)) token for token against
  the argmax of the reference forward re-run on the growing sequence (not `generate`: its cache differs from
  its own forward past the window, §12.2), with prompts longer than the window, chunked prefill (small
  max_num_batched_tokens), a shared prefix (prefix-cache hits), a mixed batch and a small KV budget
  (which preempts a request when the prompts are long);
* the same greedy tokens with GLIMMER_KERNELS=torch (every op on its plain-torch reference).

A second fuzz writes each checkpoint with transformers itself (a random MuseGlimmerForConditionalGeneration,
`save_pretrained`), as a user gets one, and takes `from_pretrained` of it as the reference: the config as the
reference serializes it (derived or explicit layer patterns, an absent theta, the legacy `rope_theta` key, the
top-level tie that drops lm_head.weight from the file), one to four layers, 1 to 6 heads, sliding windows of 1 to
40 positions and blocks of 1, 2 and 8 positions. A last test checks that every RoPE scaling transformers knows,
which Glimmer does not implement, is refused at load naming the field.

A greedy comparison skips a step whose reference top-two logits are within 1e-4 (a tie float rounding may
break either way); the fuzz fails if that leaves too few compared tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
import torch
from oracle import reference_model

from glimmer import LLM, SamplingParams
from glimmer.checkpoint.random_weights import fill_random_
from glimmer.checkpoint.tiny_tokenizer import write_tiny_tokenizer
from glimmer.checkpoint.weight_layouts import CANONICAL
from glimmer.engine.model_loader import load_model
from glimmer.errors import ConfigError
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
    pattern = [rng.random() < 0.35 for _ in range(layers)]  # True: a full-attention layer
    # NoPE mostly on the full layers, as released, but any layer may go either way (the reference allows it)
    nope = [full != (rng.random() < 0.3) for full in pattern]
    text = dataclasses.replace(
        base,
        vocab_size=tokens.vocab_size + rng.randint(0, 90),
        layer_types=tuple("full_attention" if full else "sliding_attention" for full in pattern),
        rope_layers=tuple(not no_rope for no_rope in nope),
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


# ---------------------------------------------------------------------------------------------------------
# Checkpoints written by transformers' save_pretrained, against its from_pretrained

_TINY_VISION = {"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
                "pos_emb_height": 2, "pos_emb_width": 2}


def _draw_reference_text_config(rng: random.Random, tokens) -> dict:
    """MuseGlimmerTextConfig keyword arguments as a user writes them; the reference derives what is left out."""
    heads = rng.choice([1, 2, 3, 4, 6])
    layers = rng.choice([1, 2, 3, 4])
    head_dim = rng.choice([2, 6, 8, 12, 16])
    text = {
        "vocab_size": tokens.vocab_size + rng.randint(0, 77), "hidden_size": heads * rng.choice([4, 5, 8]),
        "intermediate_size": rng.choice([3, 17, 40]), "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": rng.choice([d for d in (1, 2, 3, 4, 6) if heads % d == 0]), "head_dim": head_dim,
        "sliding_window": rng.choice([1, 2, 3, 5, 7, 13, 40]), "max_position_embeddings": rng.choice([64, 4096]),
        "rms_norm_eps": 10 ** rng.uniform(-7, -2), "post_norm_eps": 10 ** rng.uniform(-9, -2),
        "qk_scale_factor": rng.uniform(0.2, 0.95 * math.sqrt(head_dim)), "output_multiplier": rng.uniform(0.05, 2.0),
        "final_logit_softcapping": rng.uniform(0.5, 60.0), "attention_bias": rng.random() < 0.4,
        # text_config's own tie is ignored by the composite model (only the top-level one ties)
        "tie_word_embeddings": rng.random() < 0.3,
        "pad_token_id": rng.choice([None, rng.randrange(tokens.vocab_size)]),
        "bos_token_id": tokens.bos_token_id, "eos_token_id": tokens.eos_token_id,
    }
    theta = 10 ** rng.uniform(0.5, 6)
    rope = rng.choice(["absent", "legacy", "parameters"])  # absent: the reference's default theta, 10000
    if rope == "legacy":
        text["rope_theta"] = theta
    elif rope == "parameters":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    if rng.random() < 0.5:  # else the reference derives both patterns from the layer count
        full = [rng.random() < 0.4 for _ in range(layers)]
        text["layer_types"] = ["full_attention" if f else "sliding_attention" for f in full]
        # only zero (NoPE) and non-zero matter: a RoPE layer's own value is ignored (architecture.md §2.5); NoPE
        # mostly on the full layers, but full attention with RoPE and sliding windows without it run too
        nope = [f != (rng.random() < 0.3) for f in full]
        text["layer_rope_theta"] = [0 if n else rng.choice([theta, 1.0, 7]) for n in nope]
    return text


def _save_reference_checkpoint(out, seed: int):
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    tokens = write_tiny_tokenizer(out)
    rng = random.Random(seed)
    text = _draw_reference_text_config(rng, tokens)
    config = MuseGlimmerConfig(text_config=text, vision_config=_TINY_VISION, image_token_id=tokens.image_token_id,
                               video_token_id=tokens.video_token_id, out_hidden_size=32, projector_hidden_size=8,
                               tie_word_embeddings=rng.random() < 0.4)
    model = MuseGlimmerForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # norms and biases too; not the rotary buffers
            fill_random_(parameter.data, name, generator)
    model.save_pretrained(out)
    return text, tokens


def _assert_prefill_matches(ours, reference, prompts: list[list[int]], context) -> torch.Tensor:
    """Our batched prefill logits against the reference forward of each prompt alone (float32); returns ours."""
    ctx = ForwardContext.without_cache([len(p) for p in prompts])
    with torch.no_grad():
        logits = ours.compute_logits(ours(torch.tensor(sum(prompts, [])), ctx)).float()
        start = 0
        for prompt in prompts:
            expected = reference(input_ids=torch.tensor([prompt])).logits[0].float()
            got = logits[start:start + len(prompt)]
            start += len(prompt)
            assert got.shape == expected.shape
            difference = (got - expected).abs().max().item()
            assert difference < TOLERANCE, (context, difference)
    return logits


@pytest.mark.parametrize("seed", range(10))
def test_checkpoint_saved_by_transformers_matches_its_from_pretrained(tmp_path, same_cpu_kernels, seed):
    from transformers import MuseGlimmerForConditionalGeneration

    text, tokens = _save_reference_checkpoint(tmp_path, seed)
    reference = MuseGlimmerForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = load_model(tmp_path, progress=False).model
    rng = random.Random(2000 + seed)
    words = [t for t in range(3, tokens.vocab_size) if t not in (tokens.image_token_id, tokens.video_token_id)]
    window = text["sliding_window"]
    prompts = [[rng.choice(words) for _ in range(n)] for n in (min(3 * window + 5, 40), window, 1)]
    _assert_prefill_matches(ours, reference, prompts, (seed, text))

    requests = [prompts[0], prompts[0][: 2 * window + 1][:30] + [5, 6, 7], prompts[2]]
    expected = [_reference_greedy(reference, p, NEW_TOKENS, tokens.vocab_size) for p in requests]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    block_size, budget = rng.choice([(1, 3), (2, 5), (8, 9)])
    llm = LLM(str(tmp_path), device="cpu", progress=False, max_model_len=60, block_size=block_size,
              max_num_batched_tokens=budget, max_num_seqs=3)
    llm.generate([{"prompt_token_ids": requests[0]}], params, use_tqdm=False)  # fills the prefix cache
    outputs = llm.generate([{"prompt_token_ids": p} for p in requests], params, use_tqdm=False)
    compared = sum(_compare(want, clear, list(out.outputs[0].token_ids))
                   for (want, clear), out in zip(expected, outputs, strict=True))
    assert compared >= NEW_TOKENS, f"too many near-ties to compare ({compared} tokens)"


# what each scaling needs beside its type for transformers to accept the config; head_dim 16 (8 rotated pairs),
# max_position_embeddings 64, and a pretraining length of 32 where the type has one
_ROPE_SCALING_FIELDS = {
    "linear": {"factor": 2.5},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 16, "mscale": 0.8,
             "mscale_all_dim": 0.5},
    "longrope": {"short_factor": [1.0, 1.3, 1.9, 2.4, 3.0, 4.2, 5.5, 7.0], "long_factor": [9.0] * 8,
                 "original_max_position_embeddings": 32},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "proportional": {"partial_rotary_factor": 0.5, "factor": 1.5},
}


def test_the_rope_scalings_listed_here_are_every_one_transformers_knows():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(_ROPE_SCALING_FIELDS) == set(ROPE_INIT_FUNCTIONS)


def _save_scaled_reference_checkpoint(out, rope_parameters: dict, seed: int = 0):
    """A checkpoint saved by transformers with `rope_parameters`, every weight random (norms included)."""
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    tokens = write_tiny_tokenizer(out)
    text = {"vocab_size": tokens.vocab_size, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 5,
            "max_position_embeddings": 64, "qk_scale_factor": 2.5, "rope_parameters": rope_parameters,
            "bos_token_id": tokens.bos_token_id, "eos_token_id": tokens.eos_token_id,
            # RoPE on a full-attention layer and on sliding ones, NoPE on one sliding layer
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "layer_rope_theta": [rope_parameters["rope_theta"], rope_parameters["rope_theta"], 0, 0]}
    config = MuseGlimmerConfig(text_config=text, vision_config=_TINY_VISION, image_token_id=tokens.image_token_id,
                               video_token_id=tokens.video_token_id, out_hidden_size=32, projector_hidden_size=8)
    model = MuseGlimmerForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            fill_random_(parameter.data, name, generator)
    model.save_pretrained(out)
    return tokens


@pytest.mark.parametrize("rope_type", sorted(_ROPE_SCALING_FIELDS))
def test_every_rope_scaling_transformers_runs_matches_its_forward_and_greedy_decoding(tmp_path, same_cpu_kernels,
                                                                                     rope_type):
    """Each scaled table (inverse frequencies and the attention factor on cos and sin) is the reference's: prefill
    logits to 1e-4 and greedy tokens through LLM (prompts past the window, chunked prefill, a prefix-cache hit) against
    the reference forward without cache. longrope runs up to its original length (32 positions), where its table
    stays the short one; dynamic's equals the default table up to max_position_embeddings, Glimmer's limit."""
    from transformers import MuseGlimmerForConditionalGeneration

    rope_parameters = {"rope_type": rope_type, "rope_theta": 100.0, **_ROPE_SCALING_FIELDS[rope_type]}
    tokens = _save_scaled_reference_checkpoint(tmp_path, rope_parameters)
    reference = MuseGlimmerForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = load_model(tmp_path, progress=False).model
    assert ours.config.text.rope_scaling.rope_type == rope_type
    rng = random.Random(7)
    words = [t for t in range(3, tokens.vocab_size) if t not in (tokens.image_token_id, tokens.video_token_id)]
    prompts = [[rng.choice(words) for _ in range(n)] for n in (25, 5, 1)]
    logits = _assert_prefill_matches(ours, reference, prompts, rope_parameters)
    if rope_type != "dynamic":  # the scaling changes the answer (dynamic's table is the default one here)
        default = dict(rope_parameters, rope_type="default")
        for key in _ROPE_SCALING_FIELDS[rope_type]:
            default.pop(key)
        unscaled = tmp_path / "unscaled"
        _save_scaled_reference_checkpoint(unscaled, default)
        unscaled_reference = MuseGlimmerForConditionalGeneration.from_pretrained(unscaled, dtype=torch.float32)
        with torch.no_grad():
            unscaled_logits = unscaled_reference(input_ids=torch.tensor([prompts[0]])).logits[0].float()
        assert (logits[:len(prompts[0])] - unscaled_logits).abs().max().item() > 100 * TOLERANCE

    requests = [prompts[0], prompts[0][:11] + [5, 6, 7], prompts[2]]
    expected = [_reference_greedy(reference, p, NEW_TOKENS, tokens.vocab_size) for p in requests]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm = LLM(str(tmp_path), device="cpu", progress=False, max_model_len=32, block_size=2, max_num_batched_tokens=5,
              max_num_seqs=3)
    llm.generate([{"prompt_token_ids": requests[0]}], params, use_tqdm=False)  # fills the prefix cache
    outputs = llm.generate([{"prompt_token_ids": p} for p in requests], params, use_tqdm=False)
    compared = sum(_compare(want, clear, list(out.outputs[0].token_ids))
                   for (want, clear), out in zip(expected, outputs, strict=True))
    assert compared >= NEW_TOKENS, f"too many near-ties to compare ({compared} tokens)"


@pytest.mark.parametrize("rope_type", ["llama3", "yarn", "longrope"])
@pytest.mark.parametrize("own_length", [None, 32])
def test_a_top_level_original_length_is_the_pretraining_length_of_the_types_that_read_it(tmp_path, same_cpu_kernels,
                                                                                         rope_type, own_length):
    """Phi-3 and DeepSeek configs keep original_max_position_embeddings beside rope_parameters: transformers'
    standardization takes it for llama3, yarn and longrope, over the object's own. Glimmer ignored it as an unknown key
    and took max_position_embeddings (64): other logits, and longrope's max_model_len past its switch."""
    from transformers import MuseGlimmerForConditionalGeneration

    rope_parameters = {"rope_type": rope_type, "rope_theta": 100.0, **_ROPE_SCALING_FIELDS[rope_type]}
    tokens = _save_scaled_reference_checkpoint(tmp_path, rope_parameters)
    config = json.loads((tmp_path / "config.json").read_text())
    text = config["text_config"]
    text["original_max_position_embeddings"] = 20
    text["rope_parameters"].pop("original_max_position_embeddings")
    if own_length is not None:
        text["rope_parameters"]["original_max_position_embeddings"] = own_length
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = MuseGlimmerForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert reference.config.text_config.rope_parameters["original_max_position_embeddings"] == 20
    ours = load_model(tmp_path, progress=False).model
    assert ours.config.text.rope_scaling.original_max_position_embeddings == 20
    # the key is known (no "unknown keys" warning); an overridden own value is named
    overridden = "text_config.original_max_position_embeddings=20 is used and the rope object's"
    assert [overridden in warning for warning in ours.config.warnings] == ([] if own_length is None else [True])
    rng = random.Random(7)
    words = [t for t in range(3, tokens.vocab_size) if t not in (tokens.image_token_id, tokens.video_token_id)]
    _assert_prefill_matches(ours, reference, [[rng.choice(words) for _ in range(n)] for n in (20, 5, 1)], rope_type)
    if rope_type == "longrope":  # past 20 positions the reference switches to the long factors
        assert LLM(str(tmp_path), device="cpu", progress=False).engine.max_model_len == 20


def test_longrope_runs_up_to_its_original_length_and_refuses_a_longer_max_model_len(tmp_path):
    """Past original_max_position_embeddings the reference's longrope switches every position, cached keys included,
    to its long factors, which no KV cache can follow: max_model_len defaults to the original length, and a longer one
    is refused naming the field."""
    rope_parameters = {"rope_type": "longrope", "rope_theta": 100.0, **_ROPE_SCALING_FIELDS["longrope"]}
    _save_scaled_reference_checkpoint(tmp_path, rope_parameters)
    assert LLM(str(tmp_path), device="cpu", progress=False).engine.max_model_len == 32
    with pytest.raises(ConfigError, match=r"max_model_len=33 must be between 2 and the model's 32 "
                                          r"\(rope_parameters.original_max_position_embeddings"):
        LLM(str(tmp_path), device="cpu", progress=False, max_model_len=33)


@pytest.mark.parametrize("rope_type", ["yarn", "longrope"])
def test_a_scaled_table_s_16_bit_logits_are_the_reference_own(tmp_path, rope_type):
    """The attention factor multiplies cos and sin in float32, before their cast to the model dtype, as the reference
    does: in bfloat16 each prompt's logits are the reference's bits (from_pretrained keeps its frequencies float32)."""
    from transformers import MuseGlimmerForConditionalGeneration

    _save_scaled_reference_checkpoint(tmp_path, {"rope_type": rope_type, "rope_theta": 100.0,
                                                 **_ROPE_SCALING_FIELDS[rope_type]})
    reference = MuseGlimmerForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    ours = load_model(tmp_path, dtype=torch.bfloat16, progress=False).model
    ids = list(range(7, 37))
    with torch.no_grad():
        got = ours.compute_logits(ours(torch.tensor(ids), ForwardContext.without_cache([len(ids)])))
        expected = reference(input_ids=torch.tensor([ids])).logits[0]
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
