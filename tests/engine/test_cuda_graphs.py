"""Decode and verification graphs: every ladder size captured at start-up, over padding rows that touch only
the spare block.

Runs on the CPU through `eager_replay` (the same static buffers and layout, the forward run instead of
replayed); the CUDA engine tests (test_cuda_engine.py) check the captured graphs themselves."""

from __future__ import annotations

import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.cuda_graphs import DecodeGraphs, batch_size_ladder
from glimmer.engine.kv_cache_manager import FULL, page_geometry


def test_capturing_every_size_writes_only_the_spare_blocks_and_leaves_decoding_unchanged(tiny_checkpoint):
    """Decode graphs (1 token per sequence) and verification graphs (here 3) of every ladder size; 5 tokens
    per sequence is above max_query_len and left out."""
    llm = LLM(str(tiny_checkpoint), progress=False)
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 6, 7] * 9, [11] * 20]
    expected = [o.token_ids for o in llm.generate(prompts, params)]  # the eager path
    engine.add_request("held", [9] * 30, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    engine.step()  # a live sequence's keys and values are in the cache while the graphs are captured
    before = {layer: (k.clone(), v.clone()) for layer, (k, v) in runner.kv_caches.items()}
    graphs = DecodeGraphs(engine.loaded.model, runner.kv_caches, engine.kv, runner.null_blocks, 20,
                          engine.kv.blocks_needed_for(engine.max_model_len), engine.device, max_query_len=3,
                          eager_replay=True)
    graphs.capture_graphs((1, 3, 5))
    assert graphs.captured_sizes == batch_size_ladder(20) == (1, 2, 4, 8, 16, 24)
    assert set(graphs._graphs) == {(size, q) for size in batch_size_ladder(20) for q in (1, 3)}
    # each layer reads its page tensor from its offset on; the pages past the pool's (the spare chunk) are shared by
    # the layers of a tensor, and the padding rows write there only
    placement = page_geometry(engine.model_config.text).placement
    for layer, (keys, values) in runner.kv_caches.items():
        pool_end = runner.null_blocks[FULL] - placement[layer][1]
        assert torch.equal(keys[:pool_end], before[layer][0][:pool_end])
        assert torch.equal(values[:pool_end], before[layer][1][:pool_end])
    engine.abort("held")
    runner.graphs = graphs  # decode steps now run through the graphs' static buffers
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
