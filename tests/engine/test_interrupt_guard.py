"""Ctrl-C in `LLM.generate` lands between queued requests and steps (glimmer/engine/interrupt_guard.py)."""

from __future__ import annotations

import signal
import threading

import pytest

from glimmer import LLM, SamplingParams
from glimmer.engine.block_pool import PagePool
from glimmer.engine.interrupt_guard import InterruptsBetweenSteps

PROMPTS = ["hello world", "the cat", "one two three"]
PARAMS = [SamplingParams(temperature=0, max_tokens=k, ignore_eos=True) for k in (3, 8, 12)]


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint), progress=False, kv_cache_memory=16 << 20, max_model_len=256)


def _token_ids(llm: LLM) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(PROMPTS, PARAMS)]


def test_ctrl_c_while_a_finished_sequence_frees_its_kv_blocks_loses_no_block(llm, monkeypatch):
    """SIGINT landing inside freeing a block (the group's count of blocks in use lowered, the block's reference not yet
    released) raised KeyboardInterrupt there: the block was never freed again, and the group's usage read -1 from then
    on. The interrupt now comes once the step is whole, and aborts the requests still running."""
    expected = _token_ids(llm)
    release, signalled = PagePool.release, []

    def release_under_ctrl_c(pool, block, whole_chunk):
        if not signalled:
            signalled.append(block)
            signal.raise_signal(signal.SIGINT)
        release(pool, block, whole_chunk)

    monkeypatch.setattr(PagePool, "release", release_under_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, PARAMS)
    monkeypatch.undo()
    assert signalled
    assert [used for used, _ in llm.engine.kv.usage().values()] == [0] * len(llm.engine.kv.usage())
    assert not llm.engine.has_unfinished_requests
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _token_ids(llm) == expected


def test_a_second_ctrl_c_raises_at_once_and_the_handler_is_given_back():
    """A step that never ends stays interruptible: the first SIGINT is noted, the second raises where it lands."""
    reached = []
    with pytest.raises(KeyboardInterrupt), InterruptsBetweenSteps():
        signal.raise_signal(signal.SIGINT)
        reached.append("after the first")
        signal.raise_signal(signal.SIGINT)
        reached.append("after the second")
    assert reached == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_call_nested_in_one_that_holds_ctrl_c_raises_it_at_its_own_checks():
    """A use_tqdm callable generating on another LLM: the inner call reads the outer one's note at its own checks, where
    it had left the interrupt to the outer call's next check, after the whole inner call."""
    reached = []
    with pytest.raises(KeyboardInterrupt), InterruptsBetweenSteps() as outer:
        with InterruptsBetweenSteps() as inner:
            signal.raise_signal(signal.SIGINT)
            reached.append("noted")
            inner.check()
            reached.append("the inner call went on")
        outer.check()
    assert reached == ["noted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_noted_in_a_step_that_raised_something_else_is_not_lost():
    """A SIGINT noted in the step that then raised a RequestError (a grammar's failure, a later prompt refused) was
    dropped with the note: a loop over prompts catching RequestError never saw the Ctrl-C."""
    failure = ValueError("a request refused")
    with pytest.raises(KeyboardInterrupt) as raised, InterruptsBetweenSteps():
        signal.raise_signal(signal.SIGINT)
        raise failure
    assert raised.value.__cause__ is failure
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_a_request_is_queued_stops_the_call_before_the_next_is(llm, monkeypatch):
    """The check after each request is queued: a Ctrl-C in queuing the first of three prompts is raised before the
    second is queued, and the one queued is aborted."""
    expected = _token_ids(llm)
    add_request, queued = llm.engine.add_request, []

    def add_under_ctrl_c(request_id, *args, **kwargs):
        queued.append(request_id)
        add_request(request_id, *args, **kwargs)
        if len(queued) == 1:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(llm.engine, "add_request", add_under_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, PARAMS)
    monkeypatch.undo()
    assert len(queued) == 1
    assert not llm.engine.has_unfinished_requests
    assert _token_ids(llm) == expected


def test_a_callers_own_sigint_handler_and_other_threads_are_left_alone():
    heard = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
    try:
        with InterruptsBetweenSteps():
            signal.raise_signal(signal.SIGINT)
            heard_inside = list(heard)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert heard_inside == [signal.SIGINT]
    failures = []

    def enter_in_a_thread():
        try:
            with InterruptsBetweenSteps() as interrupts:
                interrupts.check()
        except BaseException as exc:  # signal.signal outside the main thread is a ValueError
            failures.append(exc)

    thread = threading.Thread(target=enter_in_a_thread)
    thread.start()
    thread.join()
    assert failures == []
