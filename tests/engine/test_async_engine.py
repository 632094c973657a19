"""The engine thread's commands as asyncio callers see them: aborting a request, or shutting the engine down, ends
the stream its caller reads."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import weakref

import pytest

from glimmer import SamplingParams
from glimmer.engine.async_engine import AsyncEngine, EngineShuttingDownError, FinishedCompletion
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.errors import ConfigError, RequestError
from glimmer.tiny import TinySpec

PROMPT = [5, 77, 130, 42, 99]


def _assert_released(engine: AsyncEngine) -> None:
    """Nothing of the engine's requests is left: no stream listened to, no KV block held."""
    assert not engine._listeners
    assert all(used == 0 for used, _ in engine.engine.kv.usage().values())


def test_aborting_a_request_ends_the_stream_its_caller_reads(tiny_checkpoint):
    # vLLM's AsyncLLM.abort(request_id) from another task: the caller's `async for` got nothing more and waited forever
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))

    async def read_until_aborted() -> list[tuple[int, str | None]]:
        received = []
        async for delta in engine.generate("r", PROMPT, SamplingParams(max_tokens=4000, ignore_eos=True, n=2)):
            received.append((delta.index, delta.finish_reason))
            if len(received) == 3:
                engine.abort("r")
        return received

    try:
        received = asyncio.run(asyncio.wait_for(read_until_aborted(), 60))
        assert sorted(finish for _, finish in received if finish is not None) == ["abort", "abort"]
        _assert_released(engine)
    finally:
        engine.shutdown()


def test_a_caller_that_stops_reading_leaves_nothing_behind(tiny_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))

    async def leave_after_one_delta() -> None:
        stream = engine.generate("r", PROMPT, SamplingParams(max_tokens=4000, ignore_eos=True, n=2))
        await anext(stream)
        await stream.aclose()  # aborts the request
        for _ in range(500):
            if not engine._listeners and not engine.engine.has_unfinished_requests:
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(leave_after_one_delta())
        _assert_released(engine)
    finally:
        engine.shutdown()


def test_shutting_down_ends_the_streams_still_read_and_refuses_later_requests(tiny_checkpoint):
    # the thread stopped without a word: a stream not ended, and any generate after, waited forever
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))

    async def shut_down_while_streaming() -> None:
        stream = engine.generate("r", PROMPT, SamplingParams(max_tokens=4000, ignore_eos=True))
        await anext(stream)
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        with pytest.raises(EngineShuttingDownError, match="shut down"):
            async for _ in stream:
                pass
        with pytest.raises(EngineShuttingDownError, match="shut down"):
            await anext(engine.generate("later", PROMPT, SamplingParams(max_tokens=2)))

    try:
        asyncio.run(asyncio.wait_for(shut_down_while_streaming(), 60))
    finally:
        engine.shutdown()
    assert not engine.is_alive


def test_shutting_down_from_an_on_finished_callback_stops_the_engine(tiny_checkpoint):
    """The callback runs on the engine thread, which shutdown() joined: it raised "cannot join current thread" (logged
    as a failed callback) on every completion that ended after it."""
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))
    raised = []

    def shut_down(_finished) -> None:
        try:
            engine.shutdown()
        except Exception as error:
            raised.append(error)

    engine.on_finished(shut_down)

    async def one_ends_while_another_streams() -> None:
        streaming = engine.generate("streaming", PROMPT, SamplingParams(max_tokens=4000, ignore_eos=True))
        await anext(streaming)
        async for _ in engine.generate("short", PROMPT, SamplingParams(max_tokens=1)):
            pass
        with pytest.raises(EngineShuttingDownError, match="shut down"):
            async for _ in streaming:
                pass

    try:
        asyncio.run(asyncio.wait_for(one_ends_while_another_streams(), 60))
        engine._thread.join(10)
        assert raised == [] and not engine.is_alive
    finally:
        engine.shutdown()


def test_generate_refuses_what_is_not_a_sampling_params_naming_it(tiny_checkpoint):
    # it failed reading `.n` of it: AttributeError: 'dict' object has no attribute 'n'
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))

    async def submit() -> None:
        await anext(engine.generate("r", PROMPT, {"max_tokens": 2}))

    try:
        with pytest.raises(RequestError, match="must be a SamplingParams, not dict") as caught:
            asyncio.run(submit())
        assert caught.value.param == "sampling_params"
    finally:
        engine.shutdown()


def test_an_engine_dropped_without_shutdown_is_freed_and_its_thread_ends(tiny_checkpoint):
    """A script that drops its AsyncEngine without `shutdown()` (a notebook cell run again): the engine thread held
    it, so its model, its KV cache and the thread stayed for the process's life."""
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))

    async def served(by: AsyncEngine) -> list[int]:
        return [token for delta in [d async for d in by.generate("r", PROMPT, SamplingParams(max_tokens=3))]
                for token in delta.token_ids]

    assert asyncio.run(served(engine))
    model, thread = weakref.ref(engine.engine), engine._thread
    del engine
    thread.join(60)  # a guard against the hang this fixes; an idle thread ends within half a second
    assert not thread.is_alive()
    gc.collect()
    assert model() is None


def test_a_request_whose_event_loop_closed_is_stopped(tiny_checkpoint):
    """A thread that ran its own event loop to read a stream's first delta and closed it (loop.close(), the stream
    unread): its output was dropped at each step, while the request ran on for nobody to its max_tokens."""
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20,
                                      max_model_len=4096))
    finished, ended = [], threading.Event()
    engine.on_finished(lambda completion: (finished.append(completion), ended.set()))
    loop = asyncio.new_event_loop()
    stream = engine.generate("r", PROMPT, SamplingParams(max_tokens=4000, ignore_eos=True))
    try:
        assert loop.run_until_complete(anext(stream)).token_ids
        loop.close()
        assert ended.wait(60)
        assert [completion.finish_reason for completion in finished] == ["abort"]
        assert finished[0].num_generation_tokens < 4000
        _assert_released(engine)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("mode", ["./my-generation-config", "VLLM", None])
def test_a_generation_config_other_than_auto_or_vllm_is_refused_before_loading(mode):
    # vLLM's third form, a folder of its own generation_config.json, is refused as LLM(...) and --generation-config
    # refuse it; it was taken silently, the server then taking the checkpoint's defaults
    with pytest.raises(ConfigError, match="generation_config=.*'auto' or 'vllm'"):
        AsyncEngine(EngineConfig(model="/nonexistent/checkpoint", progress=False), generation_config=mode)


def _held_after_the_first_completion(engine: AsyncEngine
                                     ) -> tuple[list[FinishedCompletion], threading.Event, threading.Event]:
    """(finished, holding, release): `finished` gets each completion the engine reports; reporting the first, the
    engine thread sets `holding` and waits for `release`, so that commands queued meanwhile wait to be taken."""
    finished: list[FinishedCompletion] = []
    holding, release = threading.Event(), threading.Event()

    def hold_the_engine_thread_after_the_first(completion: FinishedCompletion) -> None:
        finished.append(completion)
        if len(finished) == 1:
            holding.set()
            release.wait(60)

    engine.on_finished(hold_the_engine_thread_after_the_first)
    return finished, holding, release


def test_a_caller_that_leaves_while_its_request_waits_to_be_added_is_counted_as_aborted(tiny_checkpoint):
    """A request cancelled while queued for admission (a client that disconnected before the engine thread took its
    add) was never added and never reported to `on_finished`: /metrics' `vllm:request_success_total` had no abort for
    it, where every other aborted completion counts one."""
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))
    finished, holding, release = _held_after_the_first_completion(engine)

    async def read(stream) -> None:
        async for _ in stream:
            pass

    async def leave_while_queued() -> None:
        first = asyncio.create_task(read(engine.generate("first", PROMPT, SamplingParams(max_tokens=1))))
        await asyncio.get_running_loop().run_in_executor(None, holding.wait, 60)  # its end is reported, not yet sent
        queued = asyncio.create_task(anext(engine.generate("queued", PROMPT, SamplingParams(max_tokens=1, n=2))))
        while engine.num_waiting_requests == 0:  # the task has queued its add, which the held thread cannot take
            await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        await first
        await read(engine.generate("after", PROMPT, SamplingParams(max_tokens=1)))  # commands run in order

    try:
        asyncio.run(asyncio.wait_for(leave_while_queued(), 60))
        assert [completion.finish_reason for completion in finished] == ["length", "abort", "abort", "length"]
        left = finished[1]
        assert left.num_generation_tokens == 0 and left.queue_time is None and left.num_prompt_tokens == len(PROMPT)
        _assert_released(engine)
    finally:
        release.set()
        engine.shutdown()


_STRESS_SHAPE = {"max_model_len": 128, "block_size": 4}


def _stress_requests(rng: random.Random, shared: list[int], count: int) -> list[tuple[str, list[int], SamplingParams]]:
    """Prompts sharing prefixes that end around the block size (4) and the window (8), greedy and seeded, n > 1, stop
    strings and cache salts."""
    requests = []
    for i in range(count):
        cut = rng.choice([0, 3, 4, 5, 7, 8, 9, 16, 33])
        ids = shared[:cut] + [rng.randrange(20, 400) for _ in range(rng.randrange(1, 6))]
        greedy = rng.random() < 0.5
        requests.append((f"r{i}", ids, SamplingParams(
            temperature=0 if greedy else 1.0, seed=None if greedy else rng.randrange(1000),
            max_tokens=rng.randrange(8, 30), ignore_eos=True, n=rng.choice([1, 2]), stop=rng.choice([[], ["e"]]),
            cache_salt=rng.choice([None, None, "a"]))))
    return requests


def _alone(checkpoint, requests: list[tuple[str, list[int], SamplingParams]]
           ) -> dict[tuple[str, int], tuple[list[int], str]]:
    """Each request's tokens and finish reason per completion, run one at a time without the prefix cache."""
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, enable_prefix_caching=False, **_STRESS_SHAPE))
    outputs: dict[tuple[str, int], tuple[list[int], str]] = {}
    for request_id, ids, params in requests:
        engine.add_request(request_id, ids, params)
        while engine.has_unfinished_requests:
            for delta in engine.step():
                tokens, finish = outputs.get((request_id, delta.index), ([], None))
                outputs[request_id, delta.index] = (tokens + delta.token_ids, delta.finish_reason or finish)
    return outputs


def test_concurrent_callers_leaving_at_any_point_under_a_tiny_kv_pool_get_what_each_request_gets_alone(
        make_tiny, same_cpu_kernels, greedy_admission):
    """Callers of one engine whose pool holds little more than one sequence of max_model_len (preemption and
    recompute), with a 13-token budget (chunked prefill) and `_stress_requests`: a caller that reads to the end gets
    each completion's tokens and finish reason as the request gives alone; one that leaves after some deltas (closing
    its stream), or whose request it aborts from its task, got a prefix of them; afterwards no KV page is held,
    nothing waits and no stream is listened to."""
    checkpoint = make_tiny(seed=31, spec=TinySpec(sliding_window=8))
    rng = random.Random(5)
    shared = [rng.randrange(20, 400) for _ in range(40)]
    requests = _stress_requests(rng, shared, 16)
    expected = _alone(checkpoint, requests)
    ways = ["reads"] * 8 + ["leaves"] * 4 + ["aborted"] * 4
    rng.shuffle(ways)
    engine = AsyncEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=100_000,
                                      max_num_batched_tokens=13, max_num_seqs=4, **_STRESS_SHAPE))

    async def caller(request_id: str, ids: list[int], params: SamplingParams, way: str):
        got: dict[int, tuple[list[int], str | None]] = {}
        stream = engine.generate(request_id, ids, params)
        async for delta in stream:
            tokens, finish = got.get(delta.index, ([], None))
            got[delta.index] = (tokens + delta.token_ids, delta.finish_reason or finish)
            if way == "leaves" and sum(len(tokens) for tokens, _ in got.values()) >= 2:
                await stream.aclose()  # aborts the request
                break
            if way == "aborted" and len(got) == 1 and not got[delta.index][1]:
                engine.abort(request_id)
        return got

    async def run_all():
        results = await asyncio.gather(*(caller(*request, way) for request, way in zip(requests, ways, strict=True)))
        # commands run in order: once this one is served, every abort sent before it has freed its blocks
        async for _ in engine.generate("after", shared[:9], SamplingParams(max_tokens=2)):
            pass
        return results

    try:
        results = asyncio.run(asyncio.wait_for(run_all(), 120))
        for (request_id, _, params), way, got in zip(requests, ways, results, strict=True):
            for index in range(params.n):
                tokens, finish = got.get(index, ([], None))
                alone_tokens, alone_finish = expected[request_id, index]
                if way == "reads":
                    assert (tokens, finish) == (alone_tokens, alone_finish), (request_id, index)
                else:
                    assert tokens == alone_tokens[:len(tokens)], (request_id, index, way)
        _assert_released(engine)
        assert all(count == 0 for count in engine.engine.kv.pages.ref_counts)
        assert engine.num_waiting_requests == 0 and not engine.engine.has_unfinished_requests
    finally:
        engine.shutdown()


def test_a_prompt_list_the_caller_changes_while_its_request_waits_to_be_added_is_admitted_as_it_was(tiny_checkpoint):
    """The engine thread takes a request's add later than `generate` queues it: a caller that went on to reuse its
    prompt list meanwhile (building its next prompt in it) had the engine admit the changed list, a prompt it never
    sent, counted in the statistics at the length it had when sent. The sampling params were already copied then."""
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, kv_cache_memory=8 << 20))
    finished, holding, release = _held_after_the_first_completion(engine)

    async def read(stream) -> list:
        return [delta async for delta in stream]

    async def reuse_the_list_while_queued() -> list:
        first = asyncio.create_task(read(engine.generate("first", PROMPT, SamplingParams(max_tokens=1))))
        await asyncio.get_running_loop().run_in_executor(None, holding.wait, 60)  # its end is reported, not yet sent
        prompt = list(PROMPT)
        queued = asyncio.create_task(read(engine.generate("queued", prompt, SamplingParams(max_tokens=1))))
        while engine.num_waiting_requests == 0:  # the task has queued its add, which the held thread cannot take
            await asyncio.sleep(0)
        prompt += [7, 8, 9]
        release.set()
        await first
        return await queued

    try:
        deltas = asyncio.run(asyncio.wait_for(reuse_the_list_while_queued(), 60))
        assert [delta.num_prompt_tokens for delta in deltas] == [len(PROMPT)]
        assert [completion.num_prompt_tokens for completion in finished] == [len(PROMPT), len(PROMPT)]
        _assert_released(engine)
    finally:
        release.set()
        engine.shutdown()
