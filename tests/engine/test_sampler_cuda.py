"""The sampler's GPU work against torch's own calls (skipped without CUDA): the noise kernel's bits and generator
offsets, the whole draw with and without it, the 16-bit sort keys of top-p, and penalized steps run ahead."""

from __future__ import annotations

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine import sampler
from glimmer.engine.sampler import SamplingRow
from glimmer.model.kernels import exponential
from glimmer.tiny import TinySpec, write_tiny_checkpoint

pytestmark = pytest.mark.cuda

VOCAB = 202_048  # the released model's


def _generators(seeds_and_offsets):
    made = []
    for seed, offset in seeds_and_offsets:
        generator = torch.Generator("cuda").manual_seed(seed)
        generator.set_offset(offset)
        made.append(generator)
    return made


def test_the_noise_kernel_is_exact_on_this_gpu():
    assert exponential.exponential_exact(torch.cuda.current_device())


@pytest.mark.parametrize("width", [1, 77, VOCAB, 600_000, 1_500_000])
def test_noise_rows_equal_torchs_exponential_calls_and_leave_the_same_offsets(width):
    """Rows from distinct generators, one generator twice (its second row takes the offset the first left), seeds
    past 2^63, offsets past 2^32."""
    states = [(0, 0), (7, 4), ((1 << 64) - 1, 4 * 10**9 + 12), (1 << 63, 40), (123, 8)]
    ours, theirs = _generators(states), _generators(states)
    ours.append(ours[1])
    theirs.append(theirs[1])
    got = torch.empty(len(ours), width, device="cuda")
    assert exponential.exponential_rows_(got, ours)
    want = torch.empty_like(got)
    for j, generator in enumerate(theirs):
        want[j].exponential_(generator=generator)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert [g.get_offset() for g in ours] == [g.get_offset() for g in theirs]
    # the draws after it are torch's too
    after = [torch.rand(5, device="cuda", generator=g) for g in (ours[0], theirs[0])]
    assert torch.equal(*after)


def test_rows_the_kernel_cannot_stand_in_for_are_refused_untouched():
    noise = torch.zeros(2, 10, device="cuda")
    odd = _generators([(1, 0)])[0]
    assert not exponential.exponential_rows_(noise, [None, odd])
    assert not exponential.exponential_rows_(noise, [torch.Generator().manual_seed(0), odd])  # a CPU generator
    assert not exponential.exponential_rows_(noise.double(), [odd, odd])
    assert torch.equal(noise, torch.zeros_like(noise)) and odd.get_offset() == 0


@pytest.mark.parametrize("params", [dict(temperature=0.8), dict(temperature=1.0, top_p=0.9),
                                    dict(temperature=0.7, top_k=40, min_p=0.02),
                                    dict(temperature=1.0, repetition_penalty=1.2, frequency_penalty=0.3)])
def test_sampled_tokens_are_the_same_with_the_noise_kernel_and_with_torchs_calls(monkeypatch, params):
    generator = torch.Generator("cuda").manual_seed(4)
    logits = (torch.randn(64, VOCAB, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    states = [(i, 4 * i) for i in range(64)]

    def tokens() -> list[int]:
        rows = [SamplingRow(SamplingParams(**params), [i, 5, 9], [i + 1] * 3, g, token_count=VOCAB - 48)
                for i, g in enumerate(_generators(states))]
        return sampler.sample(logits, rows).token_ids

    fast = tokens()
    monkeypatch.setattr(sampler, "exponential_rows_", lambda *args: False)
    assert fast == tokens()


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
