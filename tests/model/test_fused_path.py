"""The fused math (one GEMM for q|k|v|gate and gate|up, one pass per sandwich norm), run with its torch
references on the CPU: the same tokens and logprobs as the plain path, and the same parameters; and the CPU's
fast path (the same with the C kernels of kernels/cpu: decode steps through the C decoder stack, or op by op with
weights packed for oneDNN or dense, whichever is faster on the machine), which agrees with the plain path to fp32
rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine import model_loader
from glimmer.model.context import ForwardContext
from glimmer.model.kernels import cpu
from glimmer.model.kernels.decoder_stack import DecoderStack
from glimmer.model.kernels.packed_linear import PackedLinear, packs
from glimmer.model.kernels.paged_attention import (
    decode_attention,
    decode_visibility_mask,
    dense_attention,
    general_visibility_mask,
    paged_attention_torch,
)
from glimmer.model.kernels.qk_norm_rope import HeadLayout, qk_norm_rope_store_torch
from glimmer.model.kernels.residual_norm import NormSpec, residual_norm_torch
from glimmer.model.layers import CenteredRMSNorm, RotaryTable, ScaledRMSNorm, apply_rotary, weightless_rms_norm
from glimmer.tiny import TinyDrafterSpec, TinySpec, write_tiny_checkpoint, write_tiny_drafter

sys.path.insert(0, str(Path(__file__).parent))
from paged_cases import make_case  # noqa: E402


def test_fused_projections_and_norms_give_the_plain_paths_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")  # both engines load the plain path; one is fused by hand
    path = write_tiny_checkpoint(tmp_path, spec=TinySpec(sliding_window=16), seed=4)
    prompts = [list(range(5, 5 + n)) for n in (3, 40, 17, 1)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    options = dict(progress=False, kv_cache_memory=8 << 20, max_num_batched_tokens=32)  # chunked prefill
    plain = LLM(str(path), **options)
    fused = LLM(str(path), **options)
    before = {k: v.clone() for k, v in fused.engine.loaded.model.state_dict().items()}
    fused.engine.loaded.model.fuse_for_inference()
    after = fused.engine.loaded.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    want, got = plain.generate(prompts, params), fused.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    diffs = [abs(a.logprob - b.logprob) for x, y in zip(got, want, strict=True)
             for a, b in zip(x.logprobs, y.logprobs, strict=True)]
    assert max(diffs) < 1e-5


def test_residual_norm_reference_is_the_modules_arithmetic():
    torch.manual_seed(0)
    post, following, final = CenteredRMSNorm(32, 1e-8), CenteredRMSNorm(32, 1e-5), ScaledRMSNorm(32, 1e-5)
    for norm in (post, following, final):
        norm.weight.data.normal_()
    h, residual = torch.randn(5, 32), torch.randn(5, 32) * 4
    new_residual, normed = residual_norm_torch(h, residual, post.spec, following.spec)
    assert torch.equal(new_residual, residual + post(h))
    assert torch.equal(normed, following(residual + post(h)))
    _, final_normed = residual_norm_torch(None, residual, None, final.spec)
    torch.testing.assert_close(final_normed, final(residual), rtol=1e-6, atol=1e-6)  # rsqrt vs pow(·, −0.5)
    assert final.spec == NormSpec(final.weight, 1e-5, 0.0)


def _plain_and_fast(tmp_path, monkeypatch, way="packed", **options):
    """The plain path (GLIMMER_KERNELS=torch) and the CPU's fast path, its decode steps through the C decoder stack
    (`way` "stack") or op by op with weights packed for oneDNN ("packed") or dense ("dense"): whichever the load-time
    timing would pick on this machine, forced here."""
    path = write_tiny_checkpoint(tmp_path, spec=TinySpec(sliding_window=16), seed=5)
    options = dict(device="cpu", progress=False, kv_cache_memory=8 << 20, max_num_batched_tokens=32, **options)
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")
    plain = LLM(str(path), **options)
    monkeypatch.delenv("GLIMMER_KERNELS")
    monkeypatch.setattr(model_loader, "stack_keeps_up", lambda text, rows, repeats=5, margin=1.1: way == "stack")
    monkeypatch.setattr(model_loader, "packing_pays", lambda weights, rows: way == "packed")
    return plain, LLM(str(path), **options)


@pytest.mark.parametrize("way", [
    pytest.param("stack", marks=pytest.mark.skipif(cpu.library() is None, reason="no C compiler here")),
    pytest.param("packed", marks=pytest.mark.skipif(not packs("cpu", torch.float32), reason="no working oneDNN")),
    "dense",
])
def test_cpu_fast_path_gives_the_plain_paths_greedy_tokens_and_close_logprobs(tmp_path, monkeypatch, way):
    plain, fast = _plain_and_fast(tmp_path, monkeypatch, way=way)
    text_model = fast.engine.loaded.model.model.language_model
    attention = text_model.layers[0].self_attn
    assert isinstance(attention.qkvg_weight, PackedLinear if way == "packed" else torch.Tensor)
    assert (attention.o_packed is not None) == (way == "packed")
    assert (text_model.decoder_stack is not None) == (way == "stack")
    assert text_model.fused
    assert not plain.engine.loaded.model.model.language_model.fused
    stack_steps = []
    if way == "stack":
        real = DecoderStack.__call__
        monkeypatch.setattr(DecoderStack, "__call__", lambda *args: stack_steps.append(1) or real(*args))
    # ragged prompts (chunked prefill), sliding-window crossings, then batched decode
    prompts = [list(range(5, 5 + n)) for n in (3, 40, 17, 1, 25)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    want, got = plain.generate(prompts, params), fast.generate(prompts, params)
    assert len(stack_steps) >= (20 if way == "stack" else 0)  # the decode steps ran there
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    diffs = [abs(a.logprob - b.logprob) for x, y in zip(got, want, strict=True)
             for a, b in zip(x.logprobs, y.logprobs, strict=True)]
    assert max(diffs) < 1e-4


@pytest.mark.skipif(not packs("cpu", torch.float32), reason="this torch build has no working oneDNN")
def test_packed_weights_replace_the_dense_ones_and_the_cacheless_forward_still_runs(tmp_path, monkeypatch):
    plain, fast = _plain_and_fast(tmp_path, monkeypatch)
    model = fast.engine.loaded.model
    layer = model.model.language_model.layers[0]
    for linear in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.down_proj):
        assert linear.weight.is_meta  # one copy of each weight: the packed one
    model.fuse_for_inference()  # a second call changes nothing
    ids = torch.arange(5, 45)
    want, got = (m.compute_logits(m(ids, ForwardContext.without_cache([40])))
                 for m in (plain.engine.loaded.model, model))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [True, False])
def test_qk_norm_rope_reference_is_the_modules_arithmetic_bit_for_bit(dtype, rope):
    torch.manual_seed(1)
    layout, n = HeadLayout(num_heads=4, num_kv_heads=2, head_dim=16), 5
    qkvg = (torch.randn(n, 2 * layout.q_size + 2 * layout.kv_size) * 3).to(dtype)
    cache_shape = (4, 4, layout.num_kv_heads, layout.head_dim)
    key_cache, value_cache = torch.zeros(cache_shape, dtype=dtype), torch.zeros(cache_shape, dtype=dtype)
    slots = torch.tensor([3, 0, 9, 14, 5])
    rotary = RotaryTable(layout.head_dim, 10000.0)(torch.tensor([7, 0, 130, 2, 64]), dtype) if rope else None
    q = qk_norm_rope_store_torch(qkvg, layout, 1e-6, 0.7, rotary, key_cache, value_cache, slots)
    q_raw, k_raw, v, _ = layout.split(qkvg)
    want_q, want_k = weightless_rms_norm(q_raw, 1e-6) * 0.7, weightless_rms_norm(k_raw, 1e-6)
    if rope:
        want_q, want_k = apply_rotary(want_q, *rotary), apply_rotary(want_k, *rotary)
    assert torch.equal(q, want_q)
    assert torch.equal(key_cache.view(-1, 2, 16)[slots], want_k)
    assert torch.equal(value_cache.view(-1, 2, 16)[slots], v)


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_mask_and_attention_are_the_general_paths_bit_for_bit(window, dtype):
    lengths = [(0, 1), (15, 1), (16, 1), (47, 1), (70, 1)]  # one token each: block and window boundaries
    case = make_case(lengths, num_q_heads=8, num_kv_heads=2, head_dim=16, sliding_window=window, dtype=dtype)
    mask = decode_visibility_mask(case.ctx, case.group, window)
    assert torch.equal(mask, general_visibility_mask(case.ctx, case.group, window))
    keys = case.key_cache[case.group.block_tables].flatten(1, 2)
    values = case.value_cache[case.group.block_tables].flatten(1, 2)
    gate = torch.randn(len(lengths), 8 * 16).to(dtype)
    got = decode_attention(case.query, keys, values, mask, 0.25, gate)
    assert torch.equal(got, dense_attention(case.query, keys, values, mask, case.ctx, 0.25, gate))
    assert torch.equal(got, paged_attention_torch(case.query, case.key_cache, case.value_cache, case.group, case.ctx,
                                                  window, 0.25, gate))


@pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
def test_the_load_time_timing_runs_both_ways_and_a_losing_stack_is_unbound(tmp_path, monkeypatch):
    path = write_tiny_checkpoint(tmp_path, spec=TinySpec(sliding_window=16), seed=5)
    timed = []
    real = model_loader.stack_keeps_up

    def spy(text, rows, repeats=5, margin=1.1):
        timed.append(rows)
        assert isinstance(real(text, rows, repeats=1), bool)  # the timing itself runs on this model
        return False

    monkeypatch.setattr(model_loader, "stack_keeps_up", spy)
    llm = LLM(str(path), device="cpu", progress=False, kv_cache_memory=8 << 20, max_num_seqs=4)
    assert timed == [[1, 4], [1, 4]]  # timed twice before the stack is given up
    assert llm.engine.loaded.model.model.language_model.decoder_stack is None  # op by op, as timed faster
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(llm.generate([[5, 6, 7]], params)[0].token_ids) == 4


@pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
def test_the_timing_steps_only_the_first_layers_whose_weights_fit_the_probe(tmp_path, monkeypatch):
    real = model_loader.stack_keeps_up
    _, fast = _plain_and_fast(tmp_path, monkeypatch, way="stack")  # (loads with the timing replaced)
    text = fast.engine.loaded.model.model.language_model
    steps = []
    monkeypatch.setattr(model_loader, "PROBE_BYTES", 1)  # one layer already passes it
    monkeypatch.setattr(text, "layers_op_by_op", lambda inputs, rotary, ctx, count: steps.append(count))
    assert isinstance(real(text, [1, 2], repeats=1), bool)
    assert steps and set(steps) == {1}


@pytest.mark.parametrize(("max_num_seqs", "wins_up_to", "timed", "limit"), [
    (64, 32, [[1, 8], [16], [32], [64]], 32),  # batches past 32 run op by op
    (64, 64, [[1, 8], [16], [32], [64]], 64),
    (20, 100, [[1, 8], [16], [20]], 20),  # the ladder ends at max_num_seqs
    (8, 100, [[1, 8]], 8),
    (64, 0, [[1, 8], [1, 8]], 0),  # not bound, after a second timing
])
def test_the_stack_takes_batches_up_to_where_it_stops_keeping_up(monkeypatch, max_num_seqs, wins_up_to, timed, limit):
    seen = []
    monkeypatch.setattr(model_loader, "stack_keeps_up",
                        lambda text, rows, repeats=5, margin=1.1: seen.append(rows) or max(rows) <= wins_up_to)
    assert model_loader.decoder_stack_rows(None, max_num_seqs) == limit
    assert seen == timed


def test_one_noisy_timing_does_not_give_the_stack_up(monkeypatch):
    readings = iter([False, True, True])  # the first timing lost (a busy moment), the second and the ladder's won
    monkeypatch.setattr(model_loader, "stack_keeps_up", lambda text, rows, repeats=5, margin=1.1: next(readings))
    assert model_loader.decoder_stack_rows(None, 16) == 16


@pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
def test_steps_past_the_stacks_rows_and_under_the_forced_reference_run_op_by_op(tmp_path, monkeypatch):
    plain, fast = _plain_and_fast(tmp_path, monkeypatch, way="stack")
    stack = fast.engine.loaded.model.model.language_model.decoder_stack
    assert stack.max_rows == fast.engine.scheduler_config.max_num_seqs  # the timing "keeps up" at every batch
    stack.max_rows = 2
    rows = []
    real = DecoderStack.__call__
    monkeypatch.setattr(DecoderStack, "__call__",
                        lambda self, x, *args: rows.append(x.shape[0]) or real(self, x, *args))
    prompts = [list(range(5, 5 + n)) for n in (3, 40, 17, 1)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for batch in (prompts[:2], prompts):
        want, got = plain.generate(batch, params), fast.generate(batch, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert rows and max(rows) == 2  # two sequences' decode steps ran in the stack; the four's op by op
    rows.clear()
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")  # set after loading: the plain math from the next step on
    assert [o.token_ids for o in fast.generate(prompts[:1], params)] == [want[0].token_ids]
    assert not rows


@pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
def test_the_stack_is_bound_for_float32_only_and_never_under_the_forced_reference(tmp_path, monkeypatch):
    path = write_tiny_checkpoint(tmp_path, spec=TinySpec(sliding_window=16), seed=5)
    monkeypatch.setattr(model_loader, "stack_keeps_up", lambda text, rows, repeats=5, margin=1.1: True)
    options = dict(device="cpu", progress=False, kv_cache_memory=8 << 20)
    for dtype, forced, bound in [("float32", False, True), ("bfloat16", False, False), ("float32", True, False)]:
        if forced:
            monkeypatch.setenv("GLIMMER_KERNELS", "torch")
        llm = LLM(str(path), dtype=dtype, **options)
        assert (llm.engine.loaded.model.model.language_model.decoder_stack is not None) == bound, (dtype, forced)


@pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
def test_speculative_decoding_through_the_stack_gives_the_plain_paths_greedy_tokens(tmp_path, monkeypatch):
    """The drafter reads the target's hidden states of the layers it names: captured by the stack on decode steps."""
    plain, _ = _plain_and_fast(tmp_path / "t", monkeypatch, way="stack")
    path = Path(plain.engine.checkpoint_dir)
    drafter = write_tiny_drafter(tmp_path / "d", path, seed=3, spec=TinyDrafterSpec(sliding_window=12))
    spec = {"method": "dflash", "model": str(drafter)}
    fast = LLM(str(path), device="cpu", progress=False, kv_cache_memory=8 << 20, speculative_config=spec)
    assert fast.engine.loaded.model.model.language_model.decoder_stack is not None
    prompts = [list(range(5, 5 + n)) for n in (3, 40, 17)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    want, got = plain.generate(prompts, params), fast.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
