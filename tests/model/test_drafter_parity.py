"""The DFlash drafter against the reference (transformers 5.23 `MuseGlimmerAssistantModel`), float32.

Tolerance 1e-4 max abs on the final hidden states (observed ~1e-6). Every weight is random, norms
included; contexts cross the drafter's sliding window; both weight layouts are loaded through Glimmer's
strict loader. The reference runs as `generate` runs it: with a `DFlashCache` told how many context rows
precede the block, and the previous block cropped before the next call (architecture.md §10.3).
"""

from __future__ import annotations

import pytest
import torch
from oracle import reference_drafter

from glimmer.checkpoint.config_layouts import load_config
from glimmer.engine.model_loader import load_drafter
from glimmer.model import drafter as drafter_module
from glimmer.model.drafter import DraftStep
from glimmer.tiny import TinyDrafterSpec, write_tiny_drafter

TOLERANCE = 1e-4
SPEC = TinyDrafterSpec(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, sliding_window=10,
                       block_size=5, target_layer_ids=(2, 0, 5))


@pytest.fixture(scope="module")
def target(make_tiny):
    return make_tiny()


@pytest.fixture(scope="module", params=["canonical", "native"])
def drafter(request, target, tmp_path_factory):
    path = write_tiny_drafter(tmp_path_factory.mktemp(f"drafter-{request.param}"), target, layout=request.param,
                              seed=7, spec=SPEC)
    return load_drafter(path, load_config(target), lambda: 0, progress=False).model


@pytest.fixture(scope="module")
def reference(target, tmp_path_factory):
    return reference_drafter(write_tiny_drafter(tmp_path_factory.mktemp("drafter-ref"), target, seed=7, spec=SPEC))


def _inputs(seed: int, context_len: int, hidden: int = 64, k: int = 3):
    generator = torch.Generator().manual_seed(seed)
    context = torch.randn(1, context_len, k * hidden, generator=generator)
    noise = torch.randn(1, SPEC.block_size, hidden, generator=generator)
    return context, noise


def _reference_step(reference, cache, context, noise, first_position: int, crop: bool):
    from transformers.cache_utils import DFlashCache  # noqa: F401  (the type generate uses)

    s, t = context.shape[1], noise.shape[1]
    cache.set_previous_accepted_tokens(s)
    if crop:
        cache.crop(-t)
    positions = torch.arange(first_position, first_position + s + t)[None]
    with torch.no_grad():
        return reference(noise_embeds=noise, context_hidden_states=context, position_ids=positions,
                         past_key_values=cache).last_hidden_state


@pytest.mark.parametrize("context_len", [7, 23])
def test_first_draft_matches_reference(drafter, reference, context_len):
    from transformers.cache_utils import DFlashCache

    context, noise = _inputs(1, context_len)
    expected = _reference_step(reference, DFlashCache(config=reference.config), context, noise, 0, crop=False)
    with torch.no_grad():
        got = drafter(noise, context)
    assert expected.abs().max() > 0.5
    assert (got - expected).abs().max().item() < TOLERANCE


def test_later_drafts_match_reference_with_its_cache(drafter, reference):
    """Three draft steps as generate makes them: the reference keeps its context in a cache and crops each
    block; ours recomputes from the whole context (a context row's keys depend on that row only)."""
    from transformers.cache_utils import DFlashCache

    cache = DFlashCache(config=reference.config)
    cache.activate_past_recording()
    contexts = []
    position = 0
    for step, new in enumerate((6, 3, 5)):
        context, noise = _inputs(10 + step, new)
        expected = _reference_step(reference, cache, context, noise, position, crop=step > 0)
        contexts.append(context)
        position += new
        full = torch.cat(contexts, dim=1)
        with torch.no_grad():
            got = drafter(noise, full)
        assert (got - expected).abs().max().item() < TOLERANCE


def test_paged_forward_matches_dense_forward(drafter, monkeypatch):
    """Context written into a paged cache in pieces, then blocks of two sequences read it, one crossing
    the window: the same hidden states as the dense forward; and the same bits when the context is gathered
    one sequence at a time (GATHER_BLOCKS below two sequences' tables)."""
    block_size, num_blocks = 4, 16
    config = drafter.config
    caches = [(torch.zeros(num_blocks, block_size, config.num_key_value_heads, config.head_dim),
               torch.zeros(num_blocks, block_size, config.num_key_value_heads, config.head_dim))
              for _ in range(config.num_hidden_layers)]
    lengths = (9, 19)
    tables = ([3, 7, 1], [2, 9, 4, 11, 5])
    contexts = [_inputs(20 + i, n)[0][0] for i, n in enumerate(lengths)]
    t = config.block_size
    noise = torch.randn(2, t, config.hidden_size, generator=torch.Generator().manual_seed(5))

    def slots(table, positions):
        return [table[p // block_size] * block_size + p % block_size for p in positions]

    empty = torch.zeros(0, t, config.hidden_size)
    with torch.no_grad():
        for lo, hi in ((0, 5), (5, 9)):  # sequence 0 in two chunks, sequence 1 alongside the second
            rows = [contexts[0][lo:hi]] + ([contexts[1]] if lo else [])
            positions = list(range(lo, hi)) + (list(range(lengths[1])) if lo else [])
            seq_slots = slots(tables[0], range(lo, hi)) + (slots(tables[1], range(lengths[1])) if lo else [])
            step = DraftStep(block_size, torch.tensor(positions), torch.tensor(seq_slots),
                             torch.zeros(0, t, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64),
                             torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
            drafter.forward_paged(torch.cat(rows), empty, step, caches)
        # sequence 1's window (10) hides its first blocks: list only the visible ones, from block 2 on
        visible = [tables[0], tables[1][2:]]
        width = max(map(len, visible))
        step = DraftStep(
            block_size, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
            torch.tensor([list(range(n, n + t)) for n in lengths]),
            torch.tensor([row + [0] * (width - len(row)) for row in visible]),
            torch.tensor([0, 2 * block_size]), torch.tensor(lengths),
        )
        got = drafter.forward_paged(torch.zeros(0, contexts[0].shape[1]), noise, step, caches)
        for i, context in enumerate(contexts):
            expected = drafter(noise[i : i + 1], context[None])
            assert (got[i] - expected[0]).abs().max().item() < TOLERANCE
        monkeypatch.setattr(drafter_module, "GATHER_BLOCKS", width + 1)
        assert torch.equal(drafter.forward_paged(torch.zeros(0, contexts[0].shape[1]), noise, step, caches), got)


def test_fused_projections_compute_what_the_plain_ones_do(target, tmp_path):
    """The device path's one gate-and-up GEMM per layer (fuse_for_inference), here through its torch fallback."""
    path = write_tiny_drafter(tmp_path / "d", target, seed=7, spec=SPEC)
    plain, fused = (load_drafter(path, load_config(target), lambda: 0, progress=False).model for _ in range(2))
    fused.fuse_for_inference()
    context, noise = _inputs(3, 12)
    with torch.no_grad():
        torch.testing.assert_close(fused(noise, context), plain(noise, context), rtol=1e-5, atol=1e-5)
    assert fused.state_dict().keys() == plain.state_dict().keys()
