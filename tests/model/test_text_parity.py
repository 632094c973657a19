"""The text decoder against the reference (transformers 5.23) on tiny random models, float32.

Tolerance: 1e-4 max abs on logits (the implementations run the same fp32 ops, so observed differences
are ~1e-7). Every weight is random, norms included; sequences are longer than the sliding window; the
configs cover several NoPE layers and GQA ratios 1, 2 and 4.
"""

from __future__ import annotations

import pytest
import torch
from oracle import reference_logits, reference_model

from glimmer.engine.model_loader import load_model
from glimmer.model.context import ForwardContext
from glimmer.tiny import TinySpec

SPECS = {
    "gqa2-8layers": TinySpec(),
    "gqa1-6layers-window5": TinySpec(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
                                    head_dim=24, hidden_size=96, sliding_window=5),
    "gqa4-12layers-window7": TinySpec(num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                                     head_dim=16, sliding_window=7),
}


@pytest.mark.parametrize("spec_name", list(SPECS))
def test_prefill_logits_match_reference(make_tiny, spec_name):
    spec = SPECS[spec_name]
    path = make_tiny(spec=spec, seed=3)
    ours = load_model(path, progress=False).model
    reference = reference_model(path)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 480, (n,), generator=generator).tolist() for n in (57, 9, 33)]
    assert max(len(p) for p in prompts) > spec.sliding_window
    ctx = ForwardContext.without_cache([len(p) for p in prompts])
    with torch.no_grad():
        logits = ours.compute_logits(ours(torch.tensor(sum(prompts, [])), ctx))
    start = 0
    for prompt in prompts:
        expected = reference_logits(reference, prompt)
        got = logits[start : start + len(prompt)]
        start += len(prompt)
        assert expected.abs().max() > 0.5, "logits too flat to be a meaningful comparison"
        assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_logits_are_the_reference_own_16_bit_logits(tiny_checkpoint, dtype):
    """In bfloat16 and float16 the forward runs the reference's ops, in its dtypes and order (architecture.md §2.8:
    fp32 norms and RoPE tables, the rest in the model dtype), so each prompt's logits are the reference's bits; the
    reference is cast as `from_pretrained(dtype=...)` leaves it, with float32 rotary frequencies."""
    ours = load_model(tiny_checkpoint, dtype=dtype, progress=False).model
    reference = reference_model(tiny_checkpoint, dtype=dtype)
    for ids in (list(range(7, 47)), list(range(100, 103))):  # past the 32-token window, and short
        with torch.no_grad():
            got = ours.compute_logits(ours(torch.tensor(ids), ForwardContext.without_cache([len(ids)])))
            expected = reference(input_ids=torch.tensor([ids])).logits[0]
        assert got.dtype == expected.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_captured_layer_outputs_are_the_reference_hidden_states(tiny_checkpoint):
    """For drafters that read the target's residual stream (architecture.md §2.7, §10): layer i's output is
    the reference's hidden_states[i + 1] (before the final norm, except for the last layer)."""
    ours = load_model(tiny_checkpoint, progress=False).model
    reference = reference_model(tiny_checkpoint)
    ids = list(range(11, 60))
    ctx = ForwardContext.without_cache([len(ids)])
    ctx.capture_layers = (0, 2, 5)
    with torch.no_grad():
        ours(torch.tensor(ids), ctx)
        expected = reference(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    for layer in ctx.capture_layers:
        assert (ctx.captured[layer] - expected[layer + 1][0]).abs().max().item() < 1e-4
