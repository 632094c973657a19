"""The device path's fused math (one GEMM for q|k|v|gate and gate|up, one pass per sandwich norm), run with
its torch references on the CPU: the same tokens and logprobs as the plain path, and the same parameters."""

from __future__ import annotations

import torch

from glimmer import LLM, SamplingParams
from glimmer.model.kernels.residual_norm import NormSpec, residual_norm_torch
from glimmer.model.layers import CenteredRMSNorm, ScaledRMSNorm
from glimmer.tiny import TinySpec, write_tiny_checkpoint


def test_fused_projections_and_norms_give_the_plain_paths_tokens(tmp_path):
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
