"""What the engine leaves free beside the KV cache on a GPU: the arithmetic of `WorkingMemory`, of the captured
graphs' kept logits and of the encoder's cache of features (the measured peaks run on the GPU:
test_cuda_engine.py)."""

import math

import numpy as np
import pytest
import torch

from glimmer.engine.cuda_graphs import batch_size_ladder
from glimmer.engine.model_runner import EncoderCache
from glimmer.engine.working_memory import WorkingMemory, graph_output_bytes
from glimmer.multimodal import MediaLimits, MediaProcessor, MediaSettings, image_grid, smart_resize

# the engines built here are sized, not timed: the kernels their load would time are fixed (conftest.py)
pytestmark = pytest.mark.usefixtures("same_cpu_kernels")


def test_each_captured_decode_graph_keeps_its_batch_of_logits():
    # 256 sequences: 1, 2, 4, 8, 16, ..., 256 rows of the 30B's 262,144 logits in bf16
    sizes = batch_size_ladder(256)
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 256
    assert graph_output_bytes(256, (1,), 262_144, 2) == sum(sizes) * 262_144 * 2
    assert graph_output_bytes(256, (1, 4, 8), 1000, 4) == sum(sizes) * 1000 * 4  # verification graphs keep none
    assert graph_output_bytes(256, (4,), 1000, 4) == 0


def test_an_eager_step_runs_beside_the_pool_of_the_graphs():
    memory = WorkingMemory(prefill=700, decode=100, sampler=50, graph_outputs=30)
    assert memory.steps == 750  # the larger step and the sampler's rows
    assert memory.total == 750 + 100 + 30  # the pool holds the largest decode step and every kept output
    eager = WorkingMemory(prefill=80, decode=100, sampler=50, graph_outputs=0)
    assert eager.steps == eager.total == 150  # no graphs: decode steps run eagerly, one at a time


def test_vision_and_the_cache_of_features_count_beside_the_larger_step():
    memory = WorkingMemory(prefill=700, decode=100, sampler=50, graph_outputs=30, vision=900, encoder_cache=40)
    assert memory.steps == 900 + 50 + 40  # the encoder's peak is the larger, and the cached features stay
    assert memory.total == memory.steps + 100 + 30


def test_the_encoder_cache_holds_a_bounded_number_of_rows_and_always_the_newest_item():
    cache = EncoderCache(max_items=3, max_rows=10)
    cache.put(b"a", torch.zeros(4, 2))
    cache.put(b"b", torch.zeros(4, 2))
    assert cache.get(b"a") is not None  # a is now the most recent
    cache.put(b"c", torch.zeros(4, 2))  # 12 rows: the least recently used (b) goes
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    cache.put(b"huge", torch.zeros(25, 2))  # larger than the bound alone: kept, the others go
    assert cache.get(b"huge") is not None and cache.get(b"a") is None and cache.get(b"c") is None
    cache.put(b"huge", torch.zeros(3, 2))  # put again: its old rows are not counted twice
    for key in (b"d", b"e"):
        cache.put(key, torch.zeros(3, 2))
    assert all(cache.get(k) is not None for k in (b"huge", b"d", b"e"))
    cache.put(b"f", torch.zeros(1, 2))  # four items: over max_items
    assert cache.get(b"huge") is None


def test_the_largest_items_are_an_image_at_the_token_cap_and_a_video_of_every_frame_at_its_largest():
    settings = MediaSettings(max_image_tokens=1024, max_video_frame_tokens=64, video_max_frames=9)
    image, video = MediaProcessor(settings).largest_grids()
    assert image == (1, 64, 64) and image[1] * image[2] // 4 == 1024
    # 9 frames in groups of 2 (the last padded); a 200:1 frame keeps one merged row of 113 tokens over the cap of 64
    assert video == (5, 2, 226)


@pytest.mark.parametrize("settings", [MediaSettings(), MediaSettings(max_image_tokens=64, max_video_frame_tokens=16)])
def test_no_image_or_video_the_limits_allow_has_a_grid_larger_than_the_largest(settings):
    """The largest grids were a square image's and a square-framed video's: an elongated one needs more where the
    token cap leaves less than one merged row, which smart_resize keeps (the reference's rule), so a video of 200:1
    frames took 8,160 tokens where the engine had planned the vision encoder's memory for 6,912."""
    limits = MediaLimits()
    processor = MediaProcessor(settings, limits)
    image, video = processor.largest_grids()
    groups = video[0]
    for shorter in range(1, 400, 3):
        most = min(limits.max_image_side, shorter * limits.max_image_aspect_ratio)
        for longer in sorted({*np.geomspace(shorter, most, 40).astype(int).tolist(), most}):
            for height, width in ((shorter, longer), (longer, shorter)):
                assert math.prod(image_grid(height, width, settings)) <= math.prod(image)
                frame_h, frame_w = smart_resize(height, width, settings.resize_factor, settings.max_video_frame_tokens)
                assert groups * (frame_h // settings.patch_size) * (frame_w // settings.patch_size) <= math.prod(video)


def test_a_cache_sized_again_after_a_shortfall_is_the_first_budget_less_the_shortfall(tiny_checkpoint, monkeypatch,
                                                                                    caplog):
    # on a GPU, start-up can keep more than planned (kernels loaded, cuBLAS's workspaces); that memory stays missing
    # from the free memory when the cache is sized again, so taking the shortfall off the free memory counted it
    # twice (an H100's 9.5 GB cache came out 7.3 GB after a 0.70 GiB shortfall). Simulated here on the CPU: the
    # first start-up falls short by `short` bytes, the second by none
    import glimmer.engine.llm_engine as llm_engine
    from glimmer.engine.llm_engine import EngineConfig, LLMEngine

    first_budget, short = 4_000_000, 1_000_000
    unshrunk = LLMEngine(EngineConfig(str(tiny_checkpoint), progress=False, kv_cache_memory=first_budget))
    shortfalls = iter([short, 0])
    monkeypatch.setattr(LLMEngine, "_working_shortfall", lambda self: next(shortfalls))
    monkeypatch.setattr(llm_engine, "device_free_bytes", lambda device: 0)
    monkeypatch.setattr(llm_engine, "_REPLAN_MARGIN_BYTES", 100_000)
    with caplog.at_level("WARNING", logger="glimmer"):
        engine = LLMEngine(EngineConfig(str(tiny_checkpoint), progress=False, kv_cache_memory=first_budget))
    assert engine._kv_budget == first_budget - short - 100_000
    page = first_budget / unshrunk.kv_layout.num_pages  # bytes a page takes, to within the rounding down
    assert unshrunk.kv_layout.num_pages - engine.kv_layout.num_pages == pytest.approx(1_100_000 / page, abs=1)
    assert "sizing the cache again" in caplog.text and "still keeps" not in caplog.text

def test_a_shortfall_left_after_sizing_the_cache_again_is_reported(tiny_checkpoint, monkeypatch, caplog):
    import glimmer.engine.llm_engine as llm_engine
    from glimmer.engine.llm_engine import EngineConfig, LLMEngine

    shortfalls = iter([2**29, 2**28])
    monkeypatch.setattr(LLMEngine, "_working_shortfall", lambda self: next(shortfalls))
    monkeypatch.setattr(llm_engine, "device_free_bytes", lambda device: 0)
    with caplog.at_level("WARNING", logger="glimmer"):
        LLMEngine(EngineConfig(str(tiny_checkpoint), progress=False, kv_cache_memory=2**31))
    assert "start-up kept 0.50 GiB more" in caplog.text and "0.75 GiB smaller" in caplog.text
    assert "start-up still keeps 0.25 GiB more" in caplog.text and "--gpu-memory-utilization" in caplog.text


@pytest.mark.parametrize("failing_call, named", [
    (0, "max_num_batched_tokens=4096"), (1, "max_num_batched_tokens=4096"), (2, "max_num_seqs=4")])
def test_a_measuring_step_the_gpu_cannot_hold_is_a_config_error_naming_its_setting(tiny_checkpoint, monkeypatch,
                                                                                   failing_call, named):
    # the 30B with its drafter on an H100 and max_num_batched_tokens=65536: the prefill chunk's measurement ran out
    # of memory, and the engine's construction failed with torch's traceback, naming no setting. Simulated on the
    # CPU: the measuring run numbered `failing_call` (prefill as one sequence, prefill spread, decode) fails
    import glimmer.engine.working_memory as working_memory
    from glimmer.engine.llm_engine import EngineConfig, LLMEngine
    from glimmer.errors import ConfigError

    model = LLMEngine(EngineConfig(str(tiny_checkpoint), progress=False, kv_cache_memory=2**22)).loaded.model
    calls = iter(range(10))

    def peak(device, run):
        if next(calls) == failing_call:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.44 GiB. GPU 0 has a total capacity "
                                         "of 79.18 GiB of which 1.26 GiB is free.")
        return 0

    monkeypatch.setattr(working_memory, "allocate_kept_workspaces", lambda device: None)
    monkeypatch.setattr(working_memory, "_peak_bytes", peak)
    with pytest.raises(ConfigError, match=named) as caught:
        working_memory.measure_working_memory(model, torch.device("cpu"), torch.float32, block_size=16,
                                              max_num_seqs=4, max_num_batched_tokens=4096)
    assert "Tried to allocate 2.44 GiB" in str(caught.value) and ("--max-num-" in str(caught.value))
