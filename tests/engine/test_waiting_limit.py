"""The server's queue limit (`--max-waiting-requests`) counts requests, not their `n` completions."""

from __future__ import annotations

import asyncio
import time

import pytest

from glimmer import SamplingParams
from glimmer.engine.async_engine import AsyncEngine, EngineOverloadedError
from glimmer.engine.llm_engine import EngineConfig

PROMPT = [5, 77, 130, 42, 99]


def test_a_request_of_many_completions_counts_once_toward_the_queue_limit(tiny_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False, max_num_seqs=1,
                                      max_model_len=4096, kv_cache_memory=64 << 20), max_waiting_requests=2)

    async def settle(waiting: int) -> None:
        deadline = time.monotonic() + 5  # (the running request takes far longer to finish)
        while engine.num_waiting_requests != waiting:
            assert time.monotonic() < deadline, engine.num_waiting_requests
            await asyncio.sleep(0.01)

    async def run() -> None:
        running = engine.generate("running", PROMPT, SamplingParams(max_tokens=4000, ignore_eos=True))
        await anext(running)  # it holds the one sequence slot for the whole test
        wide = engine.generate("wide", PROMPT, SamplingParams(max_tokens=2, n=8))
        queued = [asyncio.create_task(anext(wide))]
        await settle(1)  # eight completions waiting, one request
        narrow = engine.generate("narrow", PROMPT, SamplingParams(max_tokens=2))
        queued.append(asyncio.create_task(anext(narrow)))
        await settle(2)
        with pytest.raises(EngineOverloadedError, match="2 requests are already waiting"):
            await anext(engine.generate("over", PROMPT, SamplingParams(max_tokens=2)))
        for task in queued:  # (cancelling a caller aborts its request)
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        await running.aclose()
        await settle(0)

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
