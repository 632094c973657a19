"""Deltas coalesced for a caller slower than the engine: same tokens and text, per-token spans kept."""

from __future__ import annotations

import asyncio
import sys

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.async_engine import ENGINE_SWITCH_INTERVAL_S, AsyncEngine
from glimmer.engine.llm_engine import EngineConfig
from glimmer.engine.outputs import StepDelta


def _prompt() -> list[int]:
    generator = torch.Generator().manual_seed(5)
    return torch.randint(1, 480, (23,), generator=generator).tolist()


def test_merged_deltas_keep_each_tokens_text_span():
    first = StepDelta("r", 0, [1], "ab")
    held = StepDelta("r", 0, [2], "")  # a character still incomplete
    last = StepDelta("r", 0, [3, 4], "cd", finish_reason="stop", stop_reason=4)
    merged = first.merged(held).merged(last)
    assert (merged.token_ids, merged.text, merged.finish_reason, merged.stop_reason) == ([1, 2, 3, 4], "abcd",
                                                                                          "stop", 4)
    assert merged.text_ends() == [2, 2, 2, 4]
    # read back token by token, as the server's stop rules read it
    assert [(p.token_ids, p.text, p.finish_reason) for p in merged.pieces()] == [
        ([1], "ab", None), ([2], "", None), ([3], "", None), ([4], "cd", "stop")]


def test_a_slow_caller_gets_coalesced_deltas_with_the_same_text(tiny_checkpoint, same_cpu_kernels):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = _prompt()
    expected = LLM(str(tiny_checkpoint), progress=False).generate([prompt], params)[0]
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False))

    async def slow_caller() -> list[StepDelta]:
        received = []
        async for delta in engine.generate("slow", prompt, params):
            received.append(delta)
            for _ in range(3000):  # the engine runs on to the end (however slow the machine): the rest waits queued
                if not engine.engine.has_unfinished_requests:
                    break
                await asyncio.sleep(0.01)
        return received

    try:
        received = asyncio.run(slow_caller())
    finally:
        engine.shutdown()
    assert len(received) < len(expected.token_ids)
    assert sum((d.token_ids for d in received), []) == expected.token_ids
    assert "".join(d.text for d in received) == expected.text
    assert received[-1].finish_reason == "length"


def test_starting_the_engine_thread_shortens_the_switch_interval_and_never_lengthens_it(tiny_checkpoint):
    """The engine thread must not wait 5 ms (CPython's default) for the interpreter lock each time the event
    loop is busy writing chunks; a process that chose a shorter interval keeps it."""
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False))
        engine.shutdown()
        assert sys.getswitchinterval() == pytest.approx(ENGINE_SWITCH_INTERVAL_S)
        sys.setswitchinterval(0.0002)
        engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), progress=False))
        engine.shutdown()
        assert sys.getswitchinterval() == pytest.approx(0.0002)
    finally:
        sys.setswitchinterval(before)
