"""The sampler on the GPU (skipped without CUDA): top-p's 16-bit sort keys and penalized steps run ahead."""

from __future__ import annotations

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine import sampler
from glimmer.engine.sampler import SamplingRow
from glimmer.tiny import TinySpec, write_tiny_checkpoint

pytestmark = pytest.mark.cuda

VOCAB = 202_048  # the released model's


def test_top_p_sorts_the_16_bit_logits_with_the_same_kept_sets_as_the_float32_sort():
    generator = torch.Generator("cuda").manual_seed(5)
    raw = (torch.randn(96, VOCAB, device="cuda", generator=generator) * 2).to(torch.bfloat16)
    raw[:, 1000:1100] = raw[:, 3:4]  # ties
    temps = torch.rand(96, device="cuda", generator=generator) + 0.4
    scaled = raw.float() / temps[:, None]
    kinds = [dict(top_p=0.9), dict(top_k=40, top_p=0.8), dict(min_p=0.05, top_p=0.7), dict(top_k=3000, top_p=0.5)]
    rows = [SamplingRow(SamplingParams(temperature=float(temps[i]), **kinds[i % 4]), [], [], None) for i in range(96)]
    whole = sampler._filter(scaled, rows)
    assert torch.equal(whole, sampler._filter(scaled, rows, keys=raw))
    for i in range(0, 96, 11):
        assert torch.equal(whole[i:i + 1], sampler._filter(scaled[i:i + 1], [rows[i]]))


def test_penalized_steps_run_ahead_on_the_gpu_with_the_synchronous_outputs(tmp_path, launches):
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny", spec=TinySpec(sliding_window=16), seed=3)
    options = dict(device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20)
    prompts = [[7, 8, 9, 10] * (i + 1) for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=30, frequency_penalty=-1.0, presence_penalty=0.5,
                             ignore_eos=True),
              SamplingParams(temperature=0.9, seed=2, max_tokens=30, repetition_penalty=1.3, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)] * 2
    sync = LLM(str(checkpoint), async_scheduling=False, **options).generate(prompts, params)
    ahead = LLM(str(checkpoint), **options).generate(prompts, params)
    assert [o.token_ids for o in ahead] == [o.token_ids for o in sync]
    assert launches["rows"] > 50
