"""An engine in a forked child: the threads a model runs on (torch's OpenMP team, the grammar worker) stay in the
parent, so a child that ran the model waited for them for ever. The child's call is refused saying which start
method works (glimmer/engine/fork_guard.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys

import pytest

from glimmer import LLM, SamplingParams
from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.beam_search import BeamSearchParams
from glimmer.engine.llm_engine import EngineConfig

PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
HANG_GUARD_S = 120  # a child that hangs (the bug) is killed after this; one that answers does so in a second


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint), device="cpu", progress=False, kv_cache_memory=16 << 20, max_model_len=256)


def _in_forked_child(call) -> str:
    """What `call()` raised in a forked child, as 'ErrorType: message' ('returned' if it raised nothing)."""
    context = multiprocessing.get_context("fork")
    answers = context.SimpleQueue()

    def child():
        try:
            call()
            answers.put("returned")
        except BaseException as error:  # noqa: BLE001 - whatever it was goes back to the test
            answers.put(f"{type(error).__name__}: {error}")

    process = context.Process(target=child, daemon=True)
    process.start()
    process.join(HANG_GUARD_S)
    if process.is_alive():
        process.kill()
        process.join()
        pytest.fail("the forked child hung")
    return answers.get()


@pytest.mark.parametrize("method", ["generate", "chat", "beam_search"])
def test_an_llm_used_in_a_forked_child_is_refused_naming_spawn(llm, method):
    llm.generate([[1, 10, 11]], PARAMS)  # the parent's OpenMP team has run
    calls = {"generate": lambda: llm.generate([[1, 10, 11]], PARAMS),
             "chat": lambda: llm.chat([{"role": "user", "content": "hi"}], PARAMS),
             "beam_search": lambda: llm.beam_search([[1, 10, 11]], BeamSearchParams(beam_width=2, max_tokens=2))}
    answer = _in_forked_child(calls[method])
    assert answer.startswith("EngineForkedError: LLM." + method), answer
    assert "get_context('spawn')" in answer
    assert llm.generate([[1, 10, 11]], PARAMS)[0].outputs[0].token_ids  # the parent's LLM serves on


def test_a_new_llm_loaded_in_a_forked_child_is_refused(llm, tiny_checkpoint):
    answer = _in_forked_child(lambda: LLM(str(tiny_checkpoint), device="cpu", progress=False,
                                          kv_cache_memory=16 << 20, max_model_len=256))
    assert answer.startswith("EngineForkedError: loading an engine"), answer


def test_an_async_engine_used_in_a_forked_child_is_refused(llm, tiny_checkpoint):
    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint), device="cpu", progress=False,
                                      kv_cache_memory=16 << 20, max_model_len=256))

    async def first_delta():
        async for delta in engine.generate("r", [1, 10, 11], PARAMS):
            return delta

    try:
        assert asyncio.run(first_delta()).token_ids  # served in the parent
        answer = _in_forked_child(lambda: asyncio.run(first_delta()))
    finally:
        engine.shutdown()
    assert answer.startswith("EngineForkedError: AsyncEngine.generate"), answer


_FAILED_LOAD_THEN_FORK = """
import multiprocessing, sys
from glimmer import LLM, SamplingParams

checkpoint, failure = sys.argv[1], sys.argv[2]
options = dict(device="cpu", progress=False, kv_cache_memory=16 << 20, max_model_len=256)
# "early": refused before the weights load (no thread started); "late": the weights loaded, then the cache is too small
failing = {"early": dict(options, max_model_len=1 << 30), "late": dict(options, kv_cache_memory=1)}[failure]
try:
    LLM(checkpoint, **failing)
except Exception as error:
    print("parent:", type(error).__name__, flush=True)
else:
    raise SystemExit("the load did not fail")


def child(answers):
    try:
        llm = LLM(checkpoint, **options)
        outputs = llm.generate([[1, 10, 11]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        answers.put(f"generated {len(outputs[0].outputs[0].token_ids)}")
    except BaseException as error:
        answers.put(f"{type(error).__name__}: {error}")


context = multiprocessing.get_context("fork")
answers = context.SimpleQueue()
process = context.Process(target=child, args=(answers,), daemon=True)
process.start()
process.join(120)
if process.is_alive():
    process.kill()
    raise SystemExit("the forked child hung")
print("child:", answers.get())
"""


def _fork_after_a_failed_load(tiny_checkpoint, failure: str) -> str:
    """The output of a fresh interpreter whose LLM load failed (`failure` "early" or "late") and whose forked child
    then loaded and ran one (this test process has loaded engines, so its own forks are refused anyway)."""
    done = subprocess.run([sys.executable, "-c", _FAILED_LOAD_THEN_FORK, str(tiny_checkpoint), failure],
                          capture_output=True, text=True, timeout=2 * HANG_GUARD_S, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_load_refused_before_the_weights_leaves_forked_children_free_to_load(tiny_checkpoint):
    answer = _fork_after_a_failed_load(tiny_checkpoint, "early")
    assert "parent: ConfigError" in answer, answer
    assert "child: generated 2" in answer, answer


def test_a_load_that_failed_after_the_weights_loaded_still_refuses_forked_children(tiny_checkpoint):
    answer = _fork_after_a_failed_load(tiny_checkpoint, "late")
    assert "child: EngineForkedError: loading an engine" in answer, answer
