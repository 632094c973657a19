"""The sampler on the GPU (skipped without CUDA): top-k and top-p from counted 16-bit logits (the kernels against
their torch references and the float32 sort) and penalized steps run ahead."""

from __future__ import annotations

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine import sampler
from glimmer.engine.sampler import SamplingRow
from glimmer.tiny import TinySpec, write_tiny_checkpoint

pytestmark = pytest.mark.cuda

VOCAB = 202_048  # the released model's


def test_top_p_from_counted_16_bit_logits_keeps_the_float32_sorts_sets():
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pattern_counts_kernel_equals_the_torch_reference(dtype):
    from glimmer.model.kernels.pattern_counts import pattern_counts, pattern_counts_torch

    generator = torch.Generator("cuda").manual_seed(6)
    keys = (torch.randn(70, VOCAB + 5, device="cuda", generator=generator) * 3).to(dtype)[:, 3:VOCAB + 3]
    keys[:, 500:900] = keys[:, 1:2]  # ties: many atomic additions to one pattern
    keys[5, :] = 0.0
    logits = keys.float().masked_fill(torch.rand(70, VOCAB, device="cuda", generator=generator) < 0.2,
                                      float("-inf"))
    counts = pattern_counts(keys, logits)
    assert torch.equal(counts, pattern_counts_torch(keys, logits))
    finite = (logits > float("-inf")).sum(dim=-1)  # a ruled-out token is not counted
    assert torch.equal(counts.sum(dim=-1), finite.to(torch.int64)) and counts[5].max() == finite[5]


def test_pattern_thresholds_kernel_equals_the_torch_reference_but_where_rounding_decides():
    """Top-k exactly; top-p the same threshold, or, where they differ, one whose exact (float64) mass from the
    top lies within float32 rounding of top_p (the kernel and the reference add the mass in other orders)."""
    from glimmer.model.kernels.pattern_counts import (
        pattern_counts,
        pattern_ranks,
        pattern_thresholds_torch,
        pattern_thresholds_triton,
    )

    generator = torch.Generator("cuda").manual_seed(9)
    rows = 96
    keys = (torch.randn(rows, VOCAB, device="cuda", generator=generator)
            * (torch.rand(rows, 1, device="cuda", generator=generator) * 5 + 0.5)).to(torch.bfloat16)
    temps = torch.rand(rows, device="cuda", generator=generator) + 0.2
    scaled = (keys.float() / temps[:, None]).masked_fill(
        torch.rand(rows, VOCAB, device="cuda", generator=generator) < 0.05, float("-inf"))
    counts = pattern_counts(keys, scaled)
    values = pattern_ranks(torch.bfloat16, torch.device("cuda"))[1]
    floor = torch.where(torch.arange(rows, device="cuda") % 3 == 0, scaled.amax(dim=-1) - 4, float("-inf"))
    top_k = torch.tensor([[1, 50, 1025, 70000, VOCAB + 1][i % 5] for i in range(rows)], device="cuda")
    top_p = torch.tensor([[0.3, 0.9, 0.95, 0.999, 1.0, 0.8][i % 6] for i in range(rows)], device="cuda")
    for k, p in ((top_k, None), (None, top_p), (top_k, top_p)):
        kernel = pattern_thresholds_triton(counts, values, temps, floor, k, p)
        reference = pattern_thresholds_torch(counts, values, temps, floor, k, p)
        if p is None:
            assert torch.equal(kernel, reference)
            continue
        below = floor if k is None else pattern_thresholds_torch(counts, values, temps, floor, k, None)
        for i in torch.nonzero(kernel != reference).flatten().tolist():
            x = scaled[i].double()
            probs = torch.softmax(x.masked_fill(x < below[i].double(), float("-inf")), dim=0)
            mass = probs[x >= max(kernel[i], reference[i]).double()].sum().item()
            assert abs(mass - top_p[i].item()) < 1e-5, (i, mass)
        assert (kernel != reference).sum() <= rows // 10


@pytest.mark.parametrize("width", [700, 4096, 5000, 70000])
def test_a_rows_cumulative_mass_is_the_same_alone_in_a_batch_and_in_a_wider_tensor(width):
    """torch scans rows in an order that follows the tensor's shape (CUB's whole-tensor scan for one row); the
    Triton kernel sums each row in its own order, so a row's sums keep their bits alone, in a batch and with
    more columns after them, and stay within float32 rounding of the float64 sums."""
    from glimmer.model.kernels.pattern_counts import cumsum_rows

    generator = torch.Generator("cuda").manual_seed(16)
    values = torch.rand(9, width + 300, device="cuda", generator=generator) * torch.logspace(
        -8, 0, width + 300, device="cuda")
    whole = cumsum_rows(values[:, :width])
    for i in range(9):
        assert torch.equal(cumsum_rows(values[i:i + 1, :width]), whole[i:i + 1]), i
    assert torch.equal(cumsum_rows(values)[:, :width], whole)
    exact = values[:, :width].double().cumsum(dim=-1)
    assert ((whole.double() - exact).abs() <= 3e-5 * exact).all()  # float32 sums of up to 70,000 values
    assert (whole[:, 1:] >= whole[:, :-1]).all()  # non-negative values: the sums never fall


def _penalized(count: int, temps: torch.Tensor, generator: torch.Generator) -> list[SamplingRow]:
    kinds = [dict(top_p=0.9, repetition_penalty=1.2), dict(top_p=0.8, frequency_penalty=0.5, presence_penalty=0.5),
             dict(top_k=40, top_p=0.95, presence_penalty=1.0), dict(min_p=0.05, top_p=0.7, logit_bias={5: 3.0}),
             dict(top_k=3000, repetition_penalty=0.9)]
    prompts = torch.randint(0, VOCAB, (count, 2000), generator=generator).tolist()
    outputs = torch.randint(0, 5000, (count, 300), generator=generator).tolist()
    return [SamplingRow(SamplingParams(temperature=float(temps[i]), **kinds[i % len(kinds)]),
                        prompts[i][: 100 + 19 * i], outputs[i][: 3 * i], None) for i in range(count)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pattern_counts_kernel_sets_moved_logits_apart_as_the_torch_reference_does(dtype):
    from glimmer.model.kernels.pattern_counts import pattern_counts_and_moved, pattern_counts_and_moved_torch

    generator = torch.Generator().manual_seed(14)
    count = 60
    keys = (torch.randn(count, VOCAB, generator=generator) * 3).to(dtype).cuda()
    keys[2, 5:9] = float("nan")
    keys[::4] = keys[::4].round()  # penalties land on other tokens' values
    temps = (torch.rand(count, generator=generator) + 0.3).cuda()
    rows = _penalized(count, temps.cpu(), generator)
    rows[3].banned_ids = (1, 2, 3)
    scaled = sampler.constrain(keys.float(), rows) / temps[:, None]
    capacity = max(sampler.moved_bound(r) for r in rows)
    counts, moved = pattern_counts_and_moved(keys, scaled, temps, capacity)
    reference = pattern_counts_and_moved_torch(keys, scaled, temps, capacity)
    assert torch.equal(counts, reference[0]) and torch.equal(moved, reference[1])
    assert (moved > float("-inf")).sum(dim=-1).max() > 100


def test_top_p_of_penalized_rows_from_counted_16_bit_logits_keeps_the_float32_sorts_sets():
    """Penalties and biases move some logits off their 16-bit values: those come apart and are merged in, and the
    kept sets are the float32 sort's; a row's set is the same alone (other widths of the moved logits)."""
    generator = torch.Generator().manual_seed(15)
    count = 64
    raw = (torch.randn(count, VOCAB, generator=generator) * 2).to(torch.bfloat16).cuda()
    raw[:, 1000:1100] = raw[:, 3:4]  # ties
    temps = (torch.rand(count, generator=generator) + 0.4).cuda()
    rows = _penalized(count, temps.cpu(), generator)
    scaled = sampler.constrain(raw.float(), rows) / temps[:, None]
    whole = sampler._filter(scaled, rows)
    counted = sampler._filter(scaled, rows, keys=raw)
    assert torch.equal(whole, counted)
    for i in range(0, count, 7):
        assert torch.equal(counted[i:i + 1], sampler._filter(scaled[i:i + 1], [rows[i]], keys=raw[i:i + 1]))


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
