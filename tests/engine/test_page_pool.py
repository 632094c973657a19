"""One pool of KV pages for both layer groups: a sliding-window block is a whole chunk of pages, a full-attention
block one page (block_pool.PagePool, kv_cache_manager.PageGeometry)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.block_pool import KVBlockPool, PagePool
from glimmer.engine.kv_cache_manager import FULL, SLIDING, KVCacheLayout, KVCacheManager, page_geometry
from glimmer.engine.kv_planner import kv_bytes_per_page
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.sequence import Sequence
from glimmer.tiny import TinySpec


def _key(n: int) -> tuple[bytes, bytes]:
    return n.to_bytes(8, "little"), n.to_bytes(4, "little")


@pytest.mark.parametrize(("num_pages", "chunk"), [(30, 3), (31, 3), (17, 2), (12, 1)])
def test_random_traffic_keeps_pages_apart_and_can_take_exact(num_pages, chunk):
    """Blocks of both sizes come and go, are cached, found and revived: no page is ever in two live blocks, a chunk
    block is whole and aligned, the free counts match the pages no block holds, `can_take` answers yes exactly
    where the allocations then succeed, and a cached block found by its key was not overwritten since."""
    rng = random.Random(num_pages * 7 + chunk)
    pool = PagePool(num_pages, chunk)
    live: dict[int, tuple[bool, int]] = {}  # block → (whole chunk, references)
    content: dict[tuple[bool, int], int] = {}  # (whole chunk, block) → the number registered there
    registered: dict[int, tuple[bool, int]] = {}  # number → (whole chunk, block) it went to
    counter = 0

    def pages_of(block: int, whole: bool) -> range:
        return range(block, block + (chunk if whole else 1))

    for _ in range(3000):
        op = rng.random()
        whole = chunk > 1 and rng.random() < 0.4
        if op < 0.45:
            chunks_wanted, pages_wanted = (rng.randrange(3), rng.randrange(4)) if chunk > 1 else (0, rng.randrange(4))
            answer = pool.can_take(chunks_wanted, pages_wanted)
            trial = copy.deepcopy(pool)
            try:
                for _ in range(chunks_wanted):
                    trial.allocate(True)
                for _ in range(pages_wanted):
                    trial.allocate(False)
                possible = True
            except (KeyError, StopIteration):
                possible = False
            assert answer == possible
            if not pool.can_take(int(whole), int(not whole)):
                continue
            block = pool.allocate(whole)
            taken = set(pages_of(block, whole))
            for other, (other_whole, _) in live.items():
                assert not taken & set(pages_of(other, other_whole))
            if whole:
                assert block % chunk == 0 and block + chunk <= num_pages
            for (was_whole, at), number in list(content.items()):  # what those pages cached is gone
                if set(pages_of(at, was_whole)) & taken:
                    del content[was_whole, at]
                    del registered[number]
            live[block] = (whole, 1)
            if rng.random() < 0.7:
                counter += 1
                pool.register("g" + str(int(whole)), block, *_key(counter))
                if block in pool._cached and pool._cached[block][1] == _key(counter)[0]:
                    content[whole, block] = counter
                    registered[counter] = (whole, block)
        elif op < 0.8 and live:
            block = rng.choice(list(live))
            whole, refs = live[block]
            pool.release(block, whole)
            if refs == 1:
                del live[block]
            else:
                live[block] = (whole, refs - 1)
        elif registered:
            number = rng.choice(list(registered))
            whole, block = registered[number]
            assert pool.lookup("g" + str(int(whole)), *_key(number)) == block
            pool.acquire(block, whole)
            live[block] = (whole, live.get(block, (whole, 0))[1] + 1)
        held = sum(chunk if whole else 1 for whole, _ in live.values())
        assert pool.num_free_pages == num_pages - held


def _pool_with(chunk: int, pages: int) -> tuple[PagePool, KVBlockPool, KVBlockPool]:
    shared = PagePool(pages, chunk)
    return shared, KVBlockPool(shared, group=FULL), KVBlockPool(shared, whole_chunk=True, group=SLIDING)


def test_a_page_comes_from_a_split_chunk_before_a_whole_chunk_is_split():
    """Whole chunks are what sliding-window blocks need: one-page blocks fill split chunks first."""
    _, full, sliding = _pool_with(3, 9)
    pages = [full.allocate() for _ in range(3)]
    assert {p // 3 for p in pages} == {0}  # one chunk split, not three
    full.release(pages[1])
    assert full.allocate() == pages[1]
    assert sliding.num_free == 2 and sliding.allocate() in (3, 6)


def test_memory_that_holds_nothing_is_taken_before_cached_content_is_evicted():
    """A finished request's cached blocks survive while the pool has memory that holds nothing."""
    shared, full, sliding = _pool_with(3, 12)
    window = sliding.allocate()
    page = full.allocate()
    sliding.register(window, *_key(1))
    full.register(page, *_key(2))
    sliding.release(window)
    full.release(page)
    taken = [full.allocate() for _ in range(2)] + [sliding.allocate()]  # fits in what was never used
    assert sliding.lookup(*_key(1)) == window and full.lookup(*_key(2)) == page
    assert window not in taken and page not in taken
    sliding.allocate()  # no chunk holds nothing now: the oldest cached one, the window's, is evicted
    assert sliding.lookup(*_key(1)) is None and full.lookup(*_key(2)) == page
    assert shared.num_free_pages == 1 + 3  # a page that held nothing, and the cached page's chunk


def test_the_released_30b_geometry_has_pages_of_13_layers():
    spec = TinySpec(num_hidden_layers=52)
    from glimmer.tiny import reference_text_layer_types

    class Text:
        layer_types = reference_text_layer_types(spec.num_hidden_layers)
        full_attention_layers = tuple(i for i, t in enumerate(layer_types) if t == "full_attention")
        sliding_attention_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")

    geometry = page_geometry(Text)
    assert geometry.page_layers == 13 and geometry.pages_per_block == {FULL: 1, SLIDING: 3}
    # each page tensor is read by one full layer and three sliding layers, at offsets 0 (full), 0, 1 and 2
    readers: dict[int, list[int]] = {}
    for tensor, offset in geometry.placement.values():
        readers.setdefault(tensor, []).append(offset)
    assert sorted(readers) == list(range(13)) and all(sorted(o) == [0, 0, 1, 2] for o in readers.values())


def test_every_layer_reads_and_writes_its_own_memory(tiny_checkpoint):
    """Layers share page tensors through views at their offsets: for every block the sequences hold, no two
    (layer, block) pairs touch the same bytes, and no block's bytes reach the spare pages of padding rows."""
    llm = LLM(str(tiny_checkpoint), progress=False, kv_cache_memory=600_000, max_model_len=256)
    engine = llm.engine
    generator = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", torch.randint(20, 400, (40 + 30 * i,), generator=generator).tolist(), params)
    for _ in range(12):
        engine.step()
    runner = engine.runner
    spans: list[tuple[int, int, str]] = []
    for seq in kv_seqs(engine):
        for group, blocks in seq.blocks.items():
            layers = [layer for layer, (t, _) in page_geometry(engine.model_config.text).placement.items()
                      if (layer in engine.model_config.text.full_attention_layers) == (group == FULL)]
            for block in (b for b in blocks if b is not None):
                for layer in layers:
                    for cache in runner.kv_caches[layer]:
                        start = cache[block].data_ptr()
                        spans.append((start, start + cache[block].nbytes, f"{group} block {block} layer {layer}"))
    spans.sort()
    assert len(spans) > 100
    for (_, end, name), (start, _, other) in zip(spans, spans[1:], strict=False):
        assert end <= start, f"{name} overlaps {other}"
    null = runner.null_blocks[FULL]  # the spare pages, which layers of a page tensor share
    for layer, caches in runner.kv_caches.items():
        for cache in caches:
            spare = (cache[null].data_ptr(), cache.data_ptr() + cache.nbytes)
            assert not [name for start, end, name in spans if start < spare[1] and spare[0] < end], layer
    for i in range(4):
        engine.abort(f"r{i}")


def kv_seqs(engine) -> list[Sequence]:
    return [seq for seq in engine.scheduler.running if seq.blocks]


def test_a_budget_that_holds_every_sequence_runs_them_all_at_once(make_tiny, same_cpu_kernels):
    """Sixteen sequences of 48 positions, below the 64-position window: each needs as many sliding-window blocks as
    full-attention ones (three), and a sliding block is three times the bytes. A cache of exactly their pages runs
    them all at once; split in half between the groups (before the groups shared their pages) it held ten of them,
    and preempted and recomputed the others."""
    checkpoint = make_tiny(spec=TinySpec(sliding_window=64), seed=5)
    bytes_per_page = 8192  # 2 layers, keys and values, 16 positions, 2 kv heads of 16, float32
    budget = 16 * 3 * (1 + 3) * bytes_per_page
    llm = LLM(str(checkpoint), progress=False, kv_cache_memory=budget, max_num_seqs=16, max_model_len=256,
              enable_prefix_caching=False)
    assert kv_bytes_per_page(llm.engine.model_config.text, 16, llm.engine.dtype) == bytes_per_page
    assert llm.engine.kv_layout.num_pages == 16 * 3 * 4
    generator = torch.Generator().manual_seed(6)
    prompts = [torch.randint(20, 400, (24,), generator=generator).tolist() for _ in range(16)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert llm.engine.scheduler.num_preemptions == 0
    alone = LLM(str(checkpoint), progress=False, enable_prefix_caching=False, max_num_seqs=1)
    expected = alone.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]


def test_try_allocate_never_grants_what_the_pages_cannot_give():
    """Sequences of a scheduler-like workload in a pool with a last chunk of fewer pages: every grant allocates
    without running dry, and the layout's own accounting (usage) matches the blocks the sequences hold."""
    rng = random.Random(4)
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=41, pages_per_block={FULL: 1, SLIDING: 3},
                                      sliding_window=6))
    seqs = [Sequence(f"s{i}", list(range(1, 3 + 5 * i)), SamplingParams(), frozenset(), 200) for i in range(6)]
    grants = refusals = 0
    for _ in range(2000):
        seq, n = rng.choice(seqs), rng.choice([1, 1, 1, 2, 5, 9])
        if rng.random() < 0.04:
            kv.free(seq)
            seq.num_computed_tokens = 0
            continue
        if kv.try_allocate(seq, n):
            grants += 1
            seq.num_computed_tokens += n
        else:
            refusals += 1
        held = {g: sum(b is not None for s in seqs for b in s.blocks.get(g, [])) for g in (FULL, SLIDING)}
        assert {g: used for g, (used, _) in kv.usage().items()} == held
        assert kv.pages.num_free_pages == 41 - held[FULL] - 3 * held[SLIDING]
    assert grants > 300 and refusals > 50


@pytest.mark.parametrize(("layers", "window", "block_size", "pages_per_block"), [
    (3, 8, 4, {FULL: 1, SLIDING: 2}),  # pages of one layer
    (5, 5, 8, {FULL: 1, SLIDING: 2}),  # three sliding layers in blocks of two pages of two: one slot unread
    (2, 8, 4, {FULL: 1, SLIDING: 1}),  # one layer each: the groups share pages one for one
], ids=["3-layers", "5-layers", "2-layers"])
def test_other_page_geometries_under_stress_match_each_request_alone(make_tiny, same_cpu_kernels, greedy_admission,
                                                                      layers, window, block_size, pages_per_block):
    """Page geometries other than the default model's (a page of one layer; a sliding block of two pages whose second
    page one of its layers reads; pages shared one for one), with pages for exactly one sequence at max_model_len:
    prompts sharing prefixes (cache hits on sliding chunks), n = 2, chunked prefill and preemption give each
    request's greedy tokens alone; afterwards every page is free."""
    checkpoint = make_tiny(spec=TinySpec(num_hidden_layers=layers, sliding_window=window), seed=layers)
    common = dict(progress=False, block_size=block_size, max_model_len=96)
    alone = LLMEngine(EngineConfig(str(checkpoint), enable_prefix_caching=False, **common))
    text = alone.model_config.text
    assert page_geometry(text).pages_per_block == pages_per_block
    layout = KVCacheLayout(block_size, 0, pages_per_block, window)
    needs = KVCacheManager(layout).blocks_needed_for(96)
    floor = sum(needs[g] * pages_per_block[g] for g in pages_per_block)
    engine = LLMEngine(EngineConfig(str(checkpoint), kv_cache_memory=floor * kv_bytes_per_page(text, block_size,
                                    alone.dtype), max_num_seqs=6, max_num_batched_tokens=13, **common))
    assert engine.kv_layout.num_pages == floor
    rng = random.Random(layers)
    shared = [rng.randrange(20, 400) for _ in range(60)]
    requests = [(f"r{i}", shared[: rng.choice([1, block_size, block_size + 1, window + 1, 40])]
                 + [rng.randrange(20, 400) for _ in range(rng.randrange(1, 6))],
                 SamplingParams(temperature=0, max_tokens=rng.choice([1, 5, 30]), ignore_eos=True,
                                n=rng.choice([1, 2])))
                for i in range(8)]

    def tokens(engine: LLMEngine, batch: list) -> dict[tuple[str, int], list[int]]:
        out: dict[tuple[str, int], list[int]] = {}
        for request_id, ids, params in batch:
            engine.add_request(request_id, ids, params)
        while engine.has_unfinished_requests:
            for delta in engine.step():
                out.setdefault((delta.request_id, delta.index), []).extend(delta.token_ids)
        return out

    expected: dict[tuple[str, int], list[int]] = {}
    for request in requests:
        expected.update(tokens(alone, [request]))
    assert tokens(engine, requests) == expected
    assert engine.scheduler.num_preemptions > 0 and engine.kv.prefix_cache_hit_rate() > 0
    assert engine.kv.pages.num_free_pages == floor and engine.kv.usage_fraction() == 0
