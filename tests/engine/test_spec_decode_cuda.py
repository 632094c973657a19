"""Speculative decoding on CUDA (verification and drafter steps replayed from CUDA graphs) against the CPU
torch path, the oracle. Skipped without CUDA.

float32 greedy with speculation on the GPU — the real drafter, then replayed proposals with full, partial and
zero acceptance — is token-identical to greedy without speculation on the CPU, and the drafter proposes on
the GPU what it proposes on the CPU.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from spec_support import record_drafts

from glimmer import LLM, SamplingParams
from glimmer.engine.proposers import ReplayProposer
from glimmer.tiny import TinyDrafterSpec, TinySpec, write_tiny_checkpoint, write_tiny_drafter

pytestmark = pytest.mark.cuda

DRAFTER = TinyDrafterSpec(sliding_window=12)
K = DRAFTER.block_size - 1
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-cuda")
    target = write_tiny_checkpoint(root / "target", spec=TinySpec(sliding_window=16), seed=11)
    return target, write_tiny_drafter(root / "drafter", target, seed=5, spec=DRAFTER)


def _prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 480, (n,), generator=generator).tolist() for n in (3, 40, 17, 1, 25, 60, 9, 33)[:count]]


def _speculative(drafter) -> dict:
    return {"method": "dflash", "model": str(drafter), "draft_policy": "always"}


def test_speculation_from_cuda_graphs_equals_greedy_on_the_cpu(models):
    target, drafter = models
    prompts = _prompts(8)
    cpu_options = dict(device="cpu", progress=False, kv_cache_memory=64 << 20)
    expected = [o.token_ids for o in LLM(str(target), **cpu_options).generate(prompts, GREEDY)]
    cpu_spec = LLM(str(target), speculative_config=_speculative(drafter), **cpu_options)
    cpu_drafts = record_drafts(cpu_spec.engine)
    assert [o.token_ids for o in cpu_spec.generate(prompts, GREEDY)] == expected

    gpu = LLM(str(target), device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20,
              speculative_config=_speculative(drafter))
    assert gpu.engine.runner.graphs is not None and gpu.engine.speculator.proposer.graphs is not None
    gpu_drafts = record_drafts(gpu.engine)
    assert [o.token_ids for o in gpu.generate(prompts, GREEDY)] == expected
    assert gpu_drafts == cpu_drafts  # the drafter, replayed from its graphs, proposes what it does on the CPU

    known = {tuple(p): e for p, e in zip(prompts, expected, strict=True)}
    pattern = itertools.cycle([K, 2, 0])
    gpu.engine.speculator.proposer = ReplayProposer(
        lambda seq: known.get(tuple(seq.prompt_token_ids)), lambda seq, k: next(pattern),
        gpu.engine.model_config.text.vocab_size, K, inner=gpu.engine.speculator.proposer)
    assert [o.token_ids for o in gpu.generate(prompts, GREEDY)] == expected
    lengths = gpu.engine.speculator.stats.acceptance_lengths
    assert lengths[1] and lengths[3] and lengths[K + 1]
    assert 1 + K in {key[1] for key in gpu.engine.runner.graphs._graphs}  # verification replayed from graphs


@pytest.mark.parametrize("policy", ["always", "adaptive"])
def test_no_step_waits_for_a_graph_capture_while_serving(models, policy):
    """Start-up captures a verification graph for each k the draft policy can choose at every batch size, and
    the drafter's graphs for every batch bucket (its window spans at most 2 cache blocks: one table width):
    serving ragged batches whose requests end at different lengths (their last steps propose fewer tokens)
    captures nothing more. Captured on first use, each of these stalled its batch (80–220 ms at the 30B on an
    H200)."""
    from glimmer.engine.cuda_graphs import batch_size_ladder
    from glimmer.engine.draft_policy import draft_choices

    target, drafter = models
    llm = LLM(str(target), device="cuda", dtype="bfloat16", progress=False, kv_cache_memory=256 << 20,
              max_num_seqs=12, speculative_config={**_speculative(drafter), "draft_policy": policy})
    graphs, drafter_graphs = llm.engine.runner.graphs, llm.engine.speculator.proposer.graphs
    assert set(graphs._graphs) == {(size, 1 + k) for size in batch_size_ladder(12) for k in draft_choices(K)}
    captured = (set(graphs._graphs), set(drafter_graphs._graphs))
    assert captured[1] == {(batch, width) for batch in batch_size_ladder(12) for width in (0, 2)}
    prompts = _prompts(8) * 2
    for count in (1, 3, 12, 5, 16):
        params = [SamplingParams(temperature=0, max_tokens=7 + 5 * (i % 6), ignore_eos=True) for i in range(count)]
        outputs = llm.generate(prompts[:count], params)
        assert [len(o.token_ids) for o in outputs] == [7 + 5 * (i % 6) for i in range(count)]
    assert llm.engine.speculator.stats.num_drafts > 0
    assert (set(graphs._graphs), set(drafter_graphs._graphs)) == captured
