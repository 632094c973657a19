"""The CUDA engine path (fused weights, Triton kernels, CUDA graphs) against the CPU torch path, the oracle.

Skipped without CUDA. float32 greedy decoding on the GPU is token-identical to the CPU path (which the
CPU suite holds token-identical to transformers 5.23), through ragged batches, chunked prefill, prefix-cache
hits, window crossings, graph padding and contexts past the old 32K graph limit; bf16 at the released
geometry stays within the reference's own bf16 error.
"""

from __future__ import annotations

import dataclasses
import gc
import json

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.checkpoint.config_layouts import config_to_dict, load_config
from glimmer.engine.cuda_graphs import batch_size_ladder
from glimmer.model.context import ForwardContext
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration
from glimmer.tiny import TinySpec, released_30b_config, write_tiny_checkpoint

pytestmark = pytest.mark.cuda

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    spec = TinySpec(sliding_window=16, max_position_embeddings=65536)
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cuda-tiny"), spec=spec, seed=11)


def _prompts(count: int, seed: int = 0, lengths: tuple[int, ...] = (3, 40, 17, 1, 25, 64, 9)) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 480, (lengths[i % len(lengths)],), generator=generator).tolist() for i in range(count)]


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_float32_greedy_on_the_gpu_equals_the_cpu_path(windowed):
    prompts = _prompts(11)
    cpu = _tokens(LLM(str(windowed), device="cpu", progress=False, kv_cache_memory=64 << 20), prompts)
    options = dict(device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20)
    graphs = LLM(str(windowed), max_num_batched_tokens=48, **options)  # chunked prefill
    assert graphs.engine.runner.graphs is not None
    assert _tokens(graphs, prompts) == cpu
    assert _tokens(graphs, prompts[:5]) == cpu[:5]  # prefix-cache hits, a smaller padded graph
    assert graphs.engine.kv.prefix_cache_hit_rate() > 0
    eager = LLM(str(windowed), enforce_eager=True, **options)
    assert _tokens(eager, prompts) == cpu
    assert len(graphs.engine.runner.graphs.captured_sizes) >= 2


def test_every_decode_graph_is_captured_when_the_engine_starts(windowed):
    llm = LLM(str(windowed), device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20,
              max_num_seqs=40)
    graphs = llm.engine.runner.graphs
    assert graphs.captured_sizes == batch_size_ladder(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    before = dict(graphs._graphs)
    llm.generate(_prompts(23, seed=5), SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    assert graphs._graphs == before  # no capture while requests run


def _compiled_variants(kernel) -> int:
    """Specializations of a Triton kernel compiled in this process (Triton keeps a cache per device)."""
    if hasattr(kernel, "device_caches"):
        return sum(len(entry[0]) for entry in kernel.device_caches.values())
    return sum(len(cache) for cache in kernel.cache.values())


def _forget_compiled(kernel) -> None:
    if hasattr(kernel, "device_caches"):
        kernel.device_caches.clear()
    else:
        kernel.cache.clear()


def test_no_prefill_or_mixed_step_waits_for_a_kernel_compile(windowed):
    # a prefill or mixed step's split count follows its shape, and the step's integer fields start wherever its
    # shape puts them: the engine compiles every attention variant it can meet when it starts
    # (ModelRunner._compile_prefill_kernels) and lays the fields out 16-byte aligned (step_inputs._aligned),
    # so no kernel compiles while requests wait
    import importlib

    import triton

    modules = [importlib.import_module(f"glimmer.model.kernels.jit.{name}")
               for name in ("paged_attention", "qk_norm_rope", "residual_norm", "silu_mul", "matvec")]
    kernels = {f"{m.__name__}.{name}": k for m in modules for name, k in vars(m).items()
               if isinstance(k, triton.runtime.jit.JITFunction)}
    for kernel in kernels.values():
        _forget_compiled(kernel)  # what engines of earlier tests compiled does not count
    llm = LLM(str(windowed), device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20,
              max_num_seqs=40, max_num_batched_tokens=512)
    started = {name: _compiled_variants(kernel) for name, kernel in kernels.items()}
    assert started["glimmer.model.kernels.jit.paged_attention.attention_tiles"] >= 4
    short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for count in (1, 2, 3, 5, 8, 13, 21, 34, 40):  # ragged prefills and mixed steps of every size
        llm.generate(_prompts(count, seed=count, lengths=(2, 9, 33, 70, 5, 130, 1)), short)
    llm.generate(_prompts(3, seed=99, lengths=(900, 2, 300)), short)  # chunked: 512-token steps
    assert {name: _compiled_variants(kernel) for name, kernel in kernels.items()} == started


def test_async_scheduling_on_the_gpu_gives_the_synchronous_outputs(windowed, launches):
    prompts = _prompts(9, seed=3)
    options = dict(device="cuda", dtype="float32", progress=False, kv_cache_memory=256 << 20)
    # the stop strings come from a free run on an engine of its own: run on `sync`, it would leave its prefix cache
    # warm, and a prompt prefilled after a cache hit sums its attention in other tiles (float32 bits differ)
    free = LLM(str(windowed), async_scheduling=False, **options).generate(prompts, GREEDY)
    sync = LLM(str(windowed), async_scheduling=False, **options)
    params = [SamplingParams(temperature=0, max_tokens=40, stop=[o.text[10:13]] if len(o.text) > 16 else [],
                             logprobs=i % 4 or None)
              if i % 2 else SamplingParams(temperature=0.8, seed=i, max_tokens=5 + 3 * i, ignore_eos=True)
              for i, o in enumerate(free)]
    overlapped = LLM(str(windowed), **options)
    assert overlapped.engine.async_scheduling  # the default on CUDA
    def outputs(llm: LLM) -> list[tuple]:
        return [(o.token_ids, o.text, o.finish_reason, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs or []])
                for o in llm.generate(prompts, params)]

    assert outputs(overlapped) == outputs(sync)
    # decode steps ran ahead of the host (lookahead), through CUDA graphs of several sizes
    assert launches["rows"] > 100 and len(set(launches["sizes"])) > 3
    assert overlapped.engine.runner.graphs.captured_sizes


def test_graphs_decode_contexts_past_32k(windowed):
    prompt = _prompts(1, seed=5, lengths=(33000,))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    options = dict(device="cuda", dtype="float32", progress=False, max_model_len=34000, kv_cache_memory=1 << 30)
    graphs = LLM(str(windowed), **options)
    eager = LLM(str(windowed), enforce_eager=True, **options)
    assert _tokens(graphs, prompt, params) == _tokens(eager, prompt, params)
    assert graphs.engine.runner.graphs.captured_sizes  # the decode steps replayed a graph


def test_sampling_on_the_gpu_is_seeded_and_respects_top_k(windowed):
    llm = LLM(str(windowed), device="cuda", progress=False, kv_cache_memory=256 << 20)
    params = SamplingParams(temperature=1.0, top_k=5, top_p=0.9, max_tokens=16, seed=7, ignore_eos=True,
                            logprobs=5)
    first = llm.generate(_prompts(3), params)
    again = llm.generate(_prompts(3), params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    for out in first:
        for lp in out.logprobs:
            assert len(lp.top) == 5


def _released_geometry(tmp_path, num_layers: int):
    path = write_tiny_checkpoint(tmp_path, preset="30b", config_only=True)
    full = released_30b_config()
    n = num_layers
    text = dataclasses.replace(full.text, num_hidden_layers=n, layer_types=full.text.layer_types[-n:],
                               rope_layers=full.text.rope_layers[-n:])
    config = dataclasses.replace(full, text=text, vision=None, image_token_id=None, video_token_id=None,
                                 out_hidden_size=None, projector_hidden_size=None, projector_hidden_act=None)
    (path / "config.json").write_text(json.dumps(config_to_dict(config, "canonical")))
    return path


def test_bf16_at_the_released_geometry_stays_within_the_references_own_error(tmp_path):
    """4 layers of the 30B (3 sliding-window, 1 NoPE full), GQA 16:1, a prompt across the 2048 window, chunked."""
    path = _released_geometry(tmp_path, 4)
    llm = LLM(str(path), device="cuda", dtype="bfloat16", load_format="dummy", progress=False, max_model_len=4096,
              max_num_batched_tokens=1024, kv_cache_memory=2 << 30)
    prompt = _prompts(1, seed=3, lengths=(2600,))[0]
    steps = 4
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=20)
    out = llm.generate([prompt], params)[0]

    config = load_config(path)
    weights = {k: v.float() for k, v in llm.engine.loaded.model.state_dict().items()}
    del llm
    torch.cuda.empty_cache()
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(config)
    model = model.to_empty(device="cuda").eval()
    model.load_state_dict(weights)
    ours, references = [], []
    for i, logprobs in enumerate(out.logprobs):
        ids = torch.tensor(prompt + out.token_ids[:i], device="cuda")
        with torch.no_grad():
            exact = torch.log_softmax(model.compute_logits(
                model(ids, ForwardContext.without_cache([len(ids)], device="cuda"))[-1:]).float(), -1)[0]
            model.to(torch.bfloat16)
            half = torch.log_softmax(model.compute_logits(
                model(ids, ForwardContext.without_cache([len(ids)], device="cuda"))[-1:]).float(), -1)[0]
            model.float().load_state_dict(weights)
        top = torch.tensor(list(logprobs.top), device="cuda")
        ours.append((torch.tensor(list(logprobs.top.values()), device="cuda") - exact[top]).abs().max().item())
        references.append((half[top] - exact[top]).abs().max().item())
    assert max(ours) <= 1.5 * max(references) + 0.02, (ours, references)


@pytest.mark.parametrize(("step_gain", "kept"), [(-1.0, True), (1.0, False)])
def test_products_chosen_alone_are_kept_only_if_the_decode_step_is_faster_with_them(windowed, monkeypatch, tmp_path,
                                                                                     step_gain, kept):
    """An engine that measures its products times each batch size's decode step with them and without: a step that
    is not faster by STEP_MIN_GAIN (here made impossible, or certain) gives them up, in the cache file too."""
    from glimmer.engine import cuda_graphs
    from glimmer.model.kernels import tuned_gemm

    monkeypatch.setattr(tuned_gemm, "_chosen", {})
    monkeypatch.setattr(tuned_gemm, "_geometry", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuned_gemm, "MIN_GAIN", -10.0)  # every shape takes cuBLASLt's fastest candidate
    monkeypatch.setattr(cuda_graphs, "STEP_MIN_GAIN", step_gain)
    llm = LLM(str(windowed), device="cuda", dtype="bfloat16", progress=False, kv_cache_memory=128 << 20,
              max_num_seqs=8)
    chosen = {shape: product for (_, shape), product in tuned_gemm._chosen.items()}
    assert {shape.rows for shape in chosen} == {2, 4, 8}
    assert all((product is not None) == kept for product in chosen.values())
    saved = json.loads(next((tmp_path / "glimmer" / "gemm").glob("*.json")).read_text())["choices"]
    assert all((entry["algo"] is not None) == kept for entry in saved.values())
    assert all(("forgone" in entry) != kept for entry in saved.values())
    # either way the engine decodes in bf16 as the plain path does, within the reference's own rounding (the tuned
    # engine runs first: an engine started with GLIMMER_GEMM=cublas clears the process's choices)
    prompts = _prompts(6, seed=3)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=0, ignore_eos=True)
    tuned = llm.generate(prompts, params)
    options = dict(device="cuda", dtype="bfloat16", progress=False, kv_cache_memory=128 << 20, max_num_seqs=8)
    monkeypatch.setenv("GLIMMER_GEMM", "cublas")
    plain = LLM(str(windowed), **options)
    for a, b in zip(tuned, plain.generate(prompts, params), strict=True):
        for step, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=True)):
            assert abs(x.logprob - y.logprob) < 0.05  # greedy: the largest logprob, continuous in the logits
            if a.token_ids[step] != b.token_ids[step]:  # a near tie: the contexts differ from here on
                break


def test_the_kv_cache_takes_the_memory_left_and_the_largest_steps_still_fit(tmp_path, monkeypatch):
    """8 layers of the 30B beside a ballast that leaves about 24 GiB, with almost every byte given to the engine:
    memory freed at load (as the unfused projections are) counts as free, and the cache leaves room for the largest
    steps: full prefill chunks, 256 sequences sampled with penalties, top-p and logprobs."""
    from glimmer.engine import llm_engine
    from glimmer.engine.working_memory import device_free_bytes

    path = _released_geometry(tmp_path, 8)
    device = torch.device("cuda")
    total = torch.cuda.mem_get_info(device)[1]
    ballast = torch.empty(device_free_bytes(device) - (24 << 30), dtype=torch.uint8, device=device)
    real_load = llm_engine.load_model

    def load_then_free(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        # as fusing the projections at load does: whole blocks freed into the allocator's cache after the weights,
        # free to the KV cache, and counted so only if that cache is emptied before the KV cache is sized
        freed = torch.empty(8 << 30, dtype=torch.uint8, device=device)
        del freed
        return loaded

    monkeypatch.setattr(llm_engine, "load_model", load_then_free)
    utilization = 1 - (1 << 30) / total
    llm = LLM(str(path), device="cuda", dtype="bfloat16", load_format="dummy", progress=False, max_model_len=4096,
              gpu_memory_utilization=utilization)
    engine = llm.engine
    working = engine._working
    assert working is not None and working.prefill > 0 and working.decode > 0
    gc.collect()
    torch.cuda.empty_cache()  # measured apart from the engine's own measure, which is what is tested
    left = torch.cuda.mem_get_info(device)[0]
    # what was planned stays free (to within what start-up keeps beside it), and little more than that
    assert left >= (1 << 30) + working.steps, (left, working)
    assert left <= (1 << 30) + working.total + (4 << 30), (left, working)

    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 200_000, (300,), generator=generator).tolist() for _ in range(256)]
    params = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.2, presence_penalty=0.5, logprobs=5,
                            max_tokens=3, ignore_eos=True, seed=1)
    outs = llm.generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [3] * 256
    long = [torch.randint(0, 200_000, (4000,), generator=generator).tolist()]
    scored = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)
    assert len(llm.generate(long, scored)[0].prompt_logprobs) == 4000
    del llm, engine, ballast


def test_a_first_start_that_measures_its_products_keeps_no_more_memory_than_planned(tmp_path, monkeypatch, caplog):
    """A GPU's first start measures every product shape (kernels/tuned_gemm.py): what that keeps for good (cuBLAS's
    workspace of the one stream it runs on, the products' own) is allocated before the free memory that sizes the
    KV cache is measured. A stream per measured shape kept 32 MiB each, 1.05 GiB for the 30B, and the engine had
    to size its cache again."""
    from glimmer.model.kernels import tuned_gemm

    monkeypatch.setattr(tuned_gemm, "_chosen", {})
    monkeypatch.setattr(tuned_gemm, "_geometry", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing chosen yet: every shape is measured
    path = _released_geometry(tmp_path, 4)
    with caplog.at_level("WARNING", logger="glimmer.engine.llm_engine"):
        llm = LLM(str(path), device="cuda", dtype="bfloat16", load_format="dummy", progress=False,
                  max_model_len=4096, gpu_memory_utilization=0.5)
    assert len(tuned_gemm._chosen) > 20
    assert "more device memory than planned" not in caplog.text
    assert llm.engine._working_shortfall() <= 0
    del llm


def test_the_vision_encoder_and_its_cache_of_features_are_left_room_beside_the_kv_cache(tmp_path):
    import numpy as np
    from PIL import Image

    path = write_tiny_checkpoint(tmp_path, vision=True, seed=3)
    llm = LLM(str(path), device="cuda", dtype="bfloat16", progress=False)
    engine = llm.engine
    working, media = engine._working, engine.media
    image_grid, video_grid = media.largest_grids()
    patch_bytes = 4 * engine.model_config.vision.patch_temporal * 3 * engine.model_config.vision.patch_size**2
    assert working.vision >= patch_bytes * max(np.prod(image_grid), np.prod(video_grid))  # its pixels at least
    rows = engine.runner.encoder_cache.max_rows
    assert working.encoder_cache == rows * engine.model_config.text.hidden_size * 2
    # an image at the token cap encodes and decodes beside the cache, and is cached once
    image = Image.fromarray((np.random.RandomState(1).rand(2000, 2000, 3) * 255).astype("uint8"))
    out = llm.generate({"prompt": "<|patch|> what?", "multi_modal_data": {"image": image}},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert len(engine.runner.encoder_cache._items) == 1
