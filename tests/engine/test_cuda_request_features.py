"""Request features whose work is host-side code that the CUDA engine runs too, on the GPU against the CPU path.

Skipped without CUDA. In float32 the GPU engine gives the CPU path's tokens for `allowed_token_ids` (the sampler's
mask, shared by the CUDA sampler), for beam search (one-token requests through the ordinary engine, ranked by the
sampler's logprobs) and for a compressed-tensors NVFP4 checkpoint (dequantized on the host, then loaded as dense
weights); logprobs' alternatives come in the CPU path's order.
"""

from __future__ import annotations

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.beam_search import BeamSearchParams
from glimmer.tiny import write_tiny_checkpoint

pytestmark = pytest.mark.cuda

PROMPTS = [[5, 17, 99, 3], [250, 11], [7] * 19, [400, 1, 2, 3, 4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cuda-features"), seed=5)


def _engines(path):
    cpu = LLM(str(path), device="cpu", progress=False, kv_cache_memory=64 << 20)
    gpu = LLM(str(path), device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20)
    return cpu, gpu


def test_allowed_token_ids_on_the_gpu_give_the_cpu_paths_tokens(tiny):
    cpu, gpu = _engines(tiny)
    allowed = [3, 17, 42, 99, 100, 311]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, allowed_token_ids=allowed)
    on_cpu = [o.token_ids for o in cpu.generate(PROMPTS, params)]
    on_gpu = [o.token_ids for o in gpu.generate(PROMPTS, params)]
    assert on_gpu == on_cpu
    assert {t for tokens in on_gpu for t in tokens} <= set(allowed)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=3, allowed_token_ids=allowed)
    assert {t for o in gpu.generate(PROMPTS, sampled) for t in o.token_ids} <= set(allowed)


def test_logprob_alternatives_on_the_gpu_come_in_the_cpu_paths_order(tiny):
    cpu, gpu = _engines(tiny)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)
    for a, b in zip(cpu.generate(PROMPTS, params), gpu.generate(PROMPTS, params), strict=True):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert list(x.top) == list(y.top)
            assert torch.allclose(torch.tensor(list(x.top.values())), torch.tensor(list(y.top.values())), atol=1e-4)


def test_beam_search_on_the_gpu_gives_the_cpu_paths_beams(tiny):
    cpu, gpu = _engines(tiny)
    params = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    on_cpu = cpu.beam_search(PROMPTS, params)
    on_gpu = gpu.beam_search(PROMPTS, params)
    for a, b in zip(on_cpu, on_gpu, strict=True):
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
        for x, y in zip(a.sequences, b.sequences, strict=True):
            assert abs(x.cum_logprob - y.cum_logprob) < 1e-3


def test_an_nvfp4_checkpoint_on_the_gpu_gives_the_cpu_paths_tokens(tmp_path):
    path = write_tiny_checkpoint(tmp_path, seed=9, quantize="nvfp4")
    cpu, gpu = _engines(path)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert [o.token_ids for o in gpu.generate(PROMPTS, params)] == [o.token_ids for o in cpu.generate(PROMPTS, params)]
