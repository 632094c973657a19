"""The engine for concurrent clients: one background thread steps `LLMEngine`; asyncio callers stream.

Every touch of the engine happens on that thread. Callers submit commands (add, abort) through a queue
and receive their request's `StepDelta`s on an asyncio queue of their own event loop. A caller that
stops listening (a disconnected client) aborts its request: its KV blocks are freed and the engine
stops computing for it. A caller may leave at any moment, even while its request is still being admitted.

Failures stay with the requests they belong to: an invalid request is refused to its caller, a request whose
constraint fails it while generating ends with a RequestError (ConstraintFailure: its own fault), and a step that
fails ends the requests of its batch (each caller gets EngineStepError) while the loop goes on. Only a
failure outside any step, or several failing steps in a row, stops the thread; then every caller gets
EngineDeadError and the callbacks registered with `notify_when_dead` run (the server exits, so that a
supervisor can restart it).

The engine thread shares the interpreter lock with the event loop, which formats and writes every stream's
chunks; when the loop holds the lock, a thread that wants it waits for the switch interval (5 ms by default)
before the loop is made to yield. Starting the engine shortens the interval to ENGINE_SWITCH_INTERVAL_S, so a
step is launched at most about a millisecond late (64 streaming clients on an H200: 1,154 → 1,270 tok/s).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from glimmer.checkpoint.generation_config import check_generation_config_mode
from glimmer.engine.fork_guard import check_not_forked
from glimmer.engine.grammar import ControllerFactory
from glimmer.engine.llm_engine import (
    EngineConfig,
    LLMEngine,
    StepError,
    log_sampling_defaults,
    warn_of_default_repetition_penalty,
)
from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.sequence import MultimodalItem
from glimmer.errors import ConstraintFailure, GlimmerError, RequestError

logger = logging.getLogger(__name__)

ENGINE_SWITCH_INTERVAL_S = 0.001
"""The longest the engine thread waits for the interpreter lock while other threads run Python (see above)."""


class EngineOverloadedError(GlimmerError):
    """Too many requests are waiting; the client should retry later (HTTP 429)."""


class EngineDeadError(GlimmerError):
    """The engine thread failed; requests cannot be served (HTTP 500)."""


class EngineShuttingDownError(GlimmerError):
    """The server is shutting down: the request was stopped, or not admitted (HTTP 503)."""


class EngineStepError(GlimmerError):
    """A step failed while this request was in its batch; the request was stopped (HTTP 500)."""


MAX_CONSECUTIVE_STEP_FAILURES = 3
"""Steps in a row whose model or sampler run failed, after which the engine is taken for broken (a device
fault such as a sticky CUDA error, not one bad request: each failure already ended its batch's requests)."""


@dataclass
class FinishedCompletion:
    """One completion's life, handed to `on_finished` callbacks as it ends (vLLM's per-request statistics; a
    request of n completions gives n). Times are seconds; one not measured is None: `queue_time` of a completion
    never scheduled, `time_to_first_token`, `prefill_time` and `decode_time` of one that generated no token."""

    finish_reason: str  # "stop" | "length" | "abort" | "error" (a failed step, or the engine's death)
    num_prompt_tokens: int
    num_generation_tokens: int
    queue_time: float | None  # from the request's arrival to the completion's first step
    prefill_time: float | None  # from its first step to its first token
    decode_time: float | None  # from its first token to its last
    time_to_first_token: float | None  # from the request's arrival to the completion's first token
    e2e_latency: float  # from the request's arrival to the completion's end

    @classmethod
    def timed(cls, reason: str, num_prompt_tokens: int, num_generation_tokens: int, arrival: float,
              first_scheduled: float | None, first_token: float | None, last_token: float | None
              ) -> FinishedCompletion:
        """From the wall-clock times of the request's arrival, the completion's first step and its first and last
        tokens (None where not reached); it ends now."""
        return cls(
            reason, num_prompt_tokens, num_generation_tokens,
            queue_time=None if first_scheduled is None else max(0.0, first_scheduled - arrival),
            prefill_time=None if first_scheduled is None or first_token is None
            else max(0.0, first_token - first_scheduled),
            decode_time=None if first_token is None or last_token is None else last_token - first_token,
            time_to_first_token=None if first_token is None else max(0.0, first_token - arrival),
            e2e_latency=max(0.0, time.time() - arrival))


@dataclass
class _Clock:
    """What one completion has done so far (engine-thread bookkeeping, wall-clock times)."""

    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    tokens: int = 0

    def finished(self, reason: str, listener: _Listener) -> FinishedCompletion:
        return FinishedCompletion.timed(reason, listener.prompt_tokens, self.tokens, listener.arrival,
                                        self.first_scheduled_time, self.first_token_time, self.last_token_time)


@dataclass
class _Listener:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    remaining: int  # completions not yet finished (engine-thread bookkeeping)
    prompt_tokens: int = 0
    arrival: float = field(default_factory=time.time)
    clocks: dict[int, _Clock] = field(default_factory=dict)  # per completion index, until it finishes
    counted: bool = True  # its tokens go into EngineMetrics (its completions have clocks only where it is counted)


@dataclass
class EngineMetrics:
    """Counters the engine thread updates; read by /metrics (plain ints: reads need no lock)."""

    prompt_tokens: int = 0
    prompt_tokens_per_completion: int = 0  # each completion's prompt (n per request): vLLM runs n requests, each
    # counting its prompt, in vllm:prompt_tokens_total
    generation_tokens: int = 0
    steps: int = 0
    step_seconds: float = 0.0
    errors: int = 0
    started: float = field(default_factory=time.monotonic)


class AsyncEngine:
    def __init__(self, config: EngineConfig, *, max_waiting_requests: int = 1024, generation_config: str = "auto"):
        """generation_config: "auto", the sampling fields a request leaves out take the checkpoint's
        generation_config.json values; "vllm", OpenAI's defaults (vLLM's --generation-config, its engine's as here:
        the server built over this engine reads it). Raises ConfigError naming it for another value, before loading."""
        check_generation_config_mode(generation_config)
        self.generation_config = generation_config
        self.engine = LLMEngine(config)
        if generation_config == "auto":
            # completions keep OpenAI's max_tokens of 16 (glimmer/server/sampling.py)
            log_sampling_defaults(self.engine.generation_defaults, "requests that leave them out",
                                  "--generation-config vllm for OpenAI's defaults",
                                  max_tokens_scope="in chat and Responses requests (completions keep OpenAI's 16 "
                                                   "unless they send max_tokens: null)")
            warn_of_default_repetition_penalty(self.engine.generation_defaults, "requests that leave it out",
                                               "start with --generation-config vllm, or send repetition_penalty 1 in "
                                               "each request, to turn it off")
        self.max_waiting_requests = max_waiting_requests
        self.metrics = EngineMetrics()
        self._commands: queue.Queue = queue.Queue()
        self._listeners: dict[str, _Listener] = {}
        self._stopped = threading.Event()
        self._dead: BaseException | None = None
        self._death_callbacks: list[Callable[[BaseException], None]] = []
        self._finished_callbacks: list[Callable[[FinishedCompletion], None]] = []
        self._token_gap_callbacks: list[Callable[[float], None]] = []
        self._death_lock = threading.Lock()
        self._closing: str | None = None  # why new requests are refused (stop_serving), None while serving
        # what `num_waiting_requests` counts: requests (not their n completions) queued for admission, and those
        # the scheduler holds waiting (counted by the engine thread after each drain and step)
        self._queued_adds = 0
        self._queued_lock = threading.Lock()
        self._waiting_requests = 0
        if sys.getswitchinterval() > ENGINE_SWITCH_INTERVAL_S:  # never lengthen one a host process chose
            sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=_serve, args=(weakref.ref(self),), name="glimmer-engine", daemon=True)
        self._thread.start()

    # public, called from asyncio code --------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        multimodal: list[MultimodalItem] | None = None,
        controller_factory: ControllerFactory | None = None,
        queue_limit: bool = True,
        generated: int = 0,
        counted: bool = True,
        hidden_token_ids: frozenset[int] = frozenset(),
    ) -> AsyncIterator[StepDelta]:
        """Stream a request's deltas until every completion finishes.

        Raises RequestError (invalid request), EngineOverloadedError (queue full) or EngineDeadError
        before the first delta, and EngineStepError or EngineDeadError after it; RequestError at any point when
        the request's constraint fails it while generating (ConstraintFailure). Closing the iterator early
        aborts the request, as does cancelling the caller at any point. `queue_limit=False`: the queue-full check
        is skipped (the prompts of one API request that passed it, `check_queue_limit`: they are one request to its
        client). `generated` and `hidden_token_ids`: as LLMEngine.add_request's (a beam's tokens; a chat reply's
        hidden special tokens). `counted=False`: the request is left out of the statistics (the token counters,
        `on_finished`, `on_token_gap`), being a part of a request its caller records itself (`record_finished`): a
        beam search's one-token steps."""
        check_not_forked("AsyncEngine.generate")  # the engine thread stayed in the process that forked this one
        if not isinstance(params, SamplingParams):
            raise RequestError(f"sampling params must be a SamplingParams, not {type(params).__name__}",
                               param="sampling_params")
        # what the engine thread admits later is the request as it is now (its `n` completions are counted here), not
        # the params or lists its caller changed meanwhile (to reuse them for its next request)
        params = params.clone()
        if isinstance(prompt_token_ids, list):
            prompt_token_ids = prompt_token_ids.copy()
        if isinstance(multimodal, list):
            multimodal = multimodal.copy()
        if queue_limit:
            self.check_queue_limit()
        loop = asyncio.get_running_loop()
        listener = _Listener(loop=loop, queue=asyncio.Queue(), remaining=params.n,
                             prompt_tokens=len(prompt_token_ids),
                             clocks={i: _Clock() for i in range(params.n)} if counted else {}, counted=counted)
        accepted: Future = Future()
        with self._death_lock:  # a dying thread fails every admission queued before it died
            if self._dead is not None:
                raise EngineDeadError(f"the engine stopped after an internal error: {type(self._dead).__name__}")
            if self._closing is not None:
                raise EngineShuttingDownError(self._closing)
            with self._queued_lock:
                self._queued_adds += 1
            self._commands.put(("add", request_id,
                                (prompt_token_ids, params, multimodal, controller_factory, generated,
                                 hidden_token_ids), listener,
                                accepted))
        try:
            await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:  # the client left while the request was being queued
            self.abort(request_id)
            raise
        finished = False
        unfinished = params.n
        held = None
        try:
            while True:
                item = held if held is not None else await listener.queue.get()
                held = None
                # a caller slower than the engine finds several deltas waiting: those of one completion go as one
                while isinstance(item, StepDelta) and item.finish_reason is None and not listener.queue.empty():
                    following = listener.queue.get_nowait()
                    if isinstance(following, StepDelta) and following.index == item.index:
                        item = item.merged(following)
                    else:
                        held = following
                        break
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason is not None:
                    unfinished -= 1
                    finished = unfinished == 0
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str, index: int | None = None, *, reason: str = "abort") -> None:
        """Stop a request, or only its completion `index` (thread-safe, returns at once).

        A stopped completion's caller receives its final delta (finish_reason 'abort'): a stream still read ends.
        `reason` is the finish reason its statistics (`on_finished`) record: "stop" where the server itself ended
        the completion (a stop string it matched, say), not the client.
        """
        self._commands.put(("abort", request_id, (index, reason), None, None))

    def check_queue_limit(self) -> None:
        """Raises EngineOverloadedError while `max_waiting_requests` requests wait: the check `generate` makes, for a
        caller that queues several requests as one API request (`queue_limit=False` for each), before it queues any."""
        if self.num_waiting_requests >= self.max_waiting_requests:
            raise EngineOverloadedError(f"{self.num_waiting_requests} requests are already waiting; retry later")

    @property
    def num_waiting_requests(self) -> int:
        """Requests not yet running: queued for admission, or waiting in the scheduler (a request of n completions
        counts once, and so does a running one whose completions were pushed back to wait for memory)."""
        return self._waiting_requests + self._queued_adds

    @property
    def closing_reason(self) -> str | None:
        """Why new requests are refused (`stop_serving`, `shutdown`), None while the engine serves."""
        return self._closing

    @property
    def is_alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def failure(self) -> BaseException | None:
        """What stopped the engine thread, or None while it serves (or after a clean shutdown)."""
        return self._dead

    def notify_when_dead(self, callback: Callable[[BaseException], None]) -> None:
        """Call `callback(failure)` once if the engine thread dies (at once if it already has). It runs on
        the engine thread: keep it short and thread-safe."""
        with self._death_lock:
            if self._dead is None:
                self._death_callbacks.append(callback)
                return
        callback(self._dead)

    def on_finished(self, callback: Callable[[FinishedCompletion], None]) -> None:
        """Call `callback` with each completion's statistics as it ends, however it ends (served, aborted, failed).
        It runs on the engine thread: keep it short and thread-safe."""
        self._finished_callbacks.append(callback)

    def record_finished(self, prompt_tokens: int, completions: list[FinishedCompletion]) -> None:
        """Count a request the caller ran as uncounted parts (`generate(counted=False)`): its `prompt_tokens`, each
        completion's prompt and generated tokens go into the token counters, and each completion to the `on_finished`
        callbacks (thread-safe, returns at once; the engine thread records it)."""
        self._commands.put(("record", "", (prompt_tokens, completions), None, None))

    def on_token_gap(self, callback: Callable[[float], None]) -> None:
        """Call `callback(seconds)` each time a step gives a completion tokens after an earlier step did: the time
        since that step (vLLM's inter-token latency, one per step however many tokens it gave), measured as the engine
        hands the tokens out, not as a caller reads them (one slow to read gets several steps' tokens at once).
        It runs on the engine thread: keep it short and thread-safe."""
        self._token_gap_callbacks.append(callback)

    def _finished(self, listener: _Listener, index: int, reason: str) -> None:
        clock = listener.clocks.pop(index, None)
        if clock is None:
            return
        _notify(self._finished_callbacks, clock.finished(reason, listener), "a finished completion")

    def _end_all(self, listener: _Listener, reason: str) -> None:
        for index in list(listener.clocks):
            self._finished(listener, index, reason)

    def stop_serving(self, reason: str = "the server is shutting down") -> None:
        """Refuse new requests and stop every running one, whose caller gets EngineShuttingDownError(reason)
        (thread-safe, returns at once; a server's first shutdown signal calls it, so that open streams end
        with an error event instead of being cut when the server stops waiting for them)."""
        with self._death_lock:
            if self._closing is not None:
                return
            self._closing = reason
            self._commands.put(("stop_all", "", reason, None, None))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread, waiting up to `timeout_s` for it to end. A caller still streaming, or whose request
        waits to be admitted, gets EngineShuttingDownError; so does a later `generate` (a stream that had not ended
        waited forever). Called on the engine thread itself (from a callback), it returns at once: the thread ends
        after its turn."""
        with self._death_lock:
            if self._closing is None:
                self._closing = "the engine was shut down"
        self._stopped.set()
        self._commands.put(("wake", "", None, None, None))
        if threading.current_thread() is not self._thread:  # a thread cannot wait for itself to end
            self._thread.join(timeout_s)

    # the engine thread ------------------------------------------------------------------------------

    def _serve_once(self, consecutive_failures: int) -> int | None:
        """One turn of the engine thread: drain the commands and run a step. Returns how many steps in a row have
        failed, or None once the thread is to end (shut down, or dead: every waiting caller was told)."""
        if self._stopped.is_set():
            error = EngineShuttingDownError(self._closing)  # shut down: set before the loop was told to stop
            self._stop_requests(error)
            self._fail_queued_admissions(error)
            return None
        try:
            self._drain_commands(block=not self.engine.has_unfinished_requests)
            self._count_waiting()
            if not self.engine.has_unfinished_requests:
                return consecutive_failures
            start = time.monotonic()
            try:
                deltas = self.engine.step()
            except StepError as exc:
                consecutive_failures = consecutive_failures + 1 if exc.whole_batch else 0
                if consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                    raise
                self._dispatch(exc.deltas)
                self._fail_requests(exc)
                return consecutive_failures
            self._count_waiting()
            self.metrics.steps += 1
            self.metrics.step_seconds += time.monotonic() - start
            self._dispatch(deltas)
            return 0
        except BaseException as exc:  # the loop must never die silently: fail every waiting caller
            logger.exception("engine thread failed")
            self._die(exc)
            return None

    def _count_waiting(self) -> None:
        self._waiting_requests = len({seq.request_id for seq in self.engine.scheduler.waiting})

    def _fail_requests(self, exc: StepError) -> None:
        """End the requests of a failed step, the loop going on. A request whose own constraint failed it
        (ConstraintFailure) is at fault: its caller gets a RequestError naming the constraint's field; the others'
        callers get EngineStepError, an internal error."""
        causes = {request_id: exc.cause_of(request_id) for request_id in exc.request_ids}
        at_fault = {request_id for request_id, cause in causes.items() if isinstance(cause, ConstraintFailure)}
        internal = [request_id for request_id in causes if request_id not in at_fault]
        if internal:
            # the ids start with the responses' ids (`chatcmpl-...`), which the server's 500 and its access log lack
            logger.error("a step failed; stopping its %d request(s): %s", len(internal), ", ".join(internal),
                         exc_info=exc)
            self.metrics.errors += 1
        for request_id, cause in causes.items():
            error: GlimmerError
            if request_id in at_fault:
                logger.warning("stopping request %s: %s", request_id, cause)
                error = RequestError(f"{cause}; the request was stopped", param=cause.param)
            else:
                error = EngineStepError(f"internal error while generating ({type(cause).__name__}); "
                                        "the request was stopped")
            self.engine.abort(request_id)
            listener = self._listeners.pop(request_id, None)
            if listener is not None:
                self._end_all(listener, "error")
                _call_soon(listener.loop, listener.queue.put_nowait, error)

    def _die(self, exc: BaseException) -> None:
        with self._death_lock:
            self._dead = exc
            callbacks, self._death_callbacks = self._death_callbacks, []
        self.metrics.errors += 1
        error = EngineDeadError(f"internal engine error: {type(exc).__name__}")
        for request_id, listener in list(self._listeners.items()):
            self._end_all(listener, "error")
            _call_soon(listener.loop, listener.queue.put_nowait, error)
            self._listeners.pop(request_id, None)
        self._fail_queued_admissions(error)
        for callback in callbacks:
            try:
                callback(exc)
            except Exception:
                logger.exception("a callback for the engine's death failed")

    def _fail_queued_admissions(self, error: GlimmerError) -> None:
        """Callers whose request was still queued for admission learn at once that it never will be."""
        while True:
            try:
                kind, _, _, _, accepted = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and accepted.set_running_or_notify_cancel():
                accepted.set_exception(error)

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._execute(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _execute(self, kind: str, request_id: str, args, listener: _Listener | None, accepted: Future | None) -> None:
        if kind == "add":
            with self._queued_lock:
                self._queued_adds -= 1
            if not accepted.set_running_or_notify_cancel():
                # the caller left while its request was queued: it is never added, and its completions end aborted
                self._end_all(listener, "abort")
                return
            prompt_token_ids, params, multimodal, controller_factory, generated, hidden_token_ids = args
            try:
                self.engine.add_request(request_id, prompt_token_ids, params, multimodal, controller_factory,
                                        generated=generated, hidden_token_ids=hidden_token_ids)
            except BaseException as exc:
                accepted.set_exception(exc)
                return
            if listener.counted:
                self.metrics.prompt_tokens += len(prompt_token_ids)
                self.metrics.prompt_tokens_per_completion += len(prompt_token_ids) * params.n
            self._listeners[request_id] = listener
            accepted.set_result(None)
        elif kind == "record":
            prompt_tokens, completions = args
            self.metrics.prompt_tokens += prompt_tokens
            for completion in completions:
                self.metrics.prompt_tokens_per_completion += completion.num_prompt_tokens
                self.metrics.generation_tokens += completion.num_generation_tokens
                _notify(self._finished_callbacks, completion, "a finished completion")
        elif kind == "stop_all":
            self._stop_requests(EngineShuttingDownError(args))
        elif kind == "abort":
            # a caller still listening gets each stopped completion's final delta, so its stream ends; the listener
            # goes with the last one (a completion that ended before, its text not yet released, still sends its own)
            index, reason = args
            deltas = self.engine.abort(request_id, index)
            listener = self._listeners.get(request_id)
            if listener is not None and reason != "abort":
                for delta in deltas:
                    self._finished(listener, delta.index, reason)
            self._dispatch(deltas)

    def _stop_requests(self, error: EngineShuttingDownError) -> None:
        """Abort every request a caller is streaming; each caller gets `error`."""
        for stopped_id, stopped in list(self._listeners.items()):
            self.engine.abort(stopped_id)
            self._end_all(stopped, "abort")
            _call_soon(stopped.loop, stopped.queue.put_nowait, error)
        self._listeners.clear()

    def _dispatch(self, deltas: list[StepDelta]) -> None:
        """Hand each delta to its caller's queue: one wake-up per event loop per step, not one per delta."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, StepDelta]]] = {}
        now = time.time()
        timed: set[int] = set()  # the clocks given a gap by this step: a verification's run is several deltas
        for delta in deltas:
            listener = self._listeners.get(delta.request_id)
            if listener is None or listener.counted:
                self.metrics.generation_tokens += len(delta.token_ids)
            if listener is None:
                continue
            if listener.loop.is_closed():  # its caller's event loop closed with the stream unread: nobody reads on
                self._listeners.pop(delta.request_id)
                self.engine.abort(delta.request_id)
                self._end_all(listener, "abort")
                continue
            clock = listener.clocks.get(delta.index)
            if clock is not None:
                clock.first_scheduled_time = delta.first_scheduled_time or clock.first_scheduled_time
                if delta.token_ids:
                    if clock.last_token_time is not None and id(clock) not in timed:
                        _notify(self._token_gap_callbacks, now - clock.last_token_time, "a gap between tokens")
                    timed.add(id(clock))
                    clock.tokens += len(delta.token_ids)
                    clock.first_token_time = clock.first_token_time or now
                    clock.last_token_time = now
            by_loop.setdefault(listener.loop, []).append((listener.queue, delta))
            if delta.finish_reason is not None:
                self._finished(listener, delta.index, delta.finish_reason)
                listener.remaining -= 1
                if listener.remaining == 0:
                    self._listeners.pop(delta.request_id, None)
        for loop, items in by_loop.items():
            _call_soon(loop, _deliver, items)


def _serve(engine_ref: weakref.ref[AsyncEngine]) -> None:
    """The engine thread. It holds its AsyncEngine only for a turn (`_serve_once`: at most half a second while idle),
    so an engine dropped without `shutdown()` is freed and its thread ends: one that held it kept the model, the KV
    cache and the thread for the process's life. A caller still streaming holds the engine (its stream's frame)."""
    consecutive_failures: int | None = 0
    while consecutive_failures is not None:
        engine = engine_ref()
        if engine is None:
            return
        consecutive_failures = engine._serve_once(consecutive_failures)
        del engine


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object) -> None:
    """`loop.call_soon_threadsafe`, except that a caller whose event loop has closed (a server forced to quit)
    is dropped instead of stopping the engine thread."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # "Event loop is closed": nobody is left to receive it
        logger.debug("dropped output for a closed event loop")


_Value = TypeVar("_Value")


def _notify(callbacks: list[Callable[[_Value], None]], value: _Value, what: str) -> None:
    """Call each statistics callback with `value`; one that fails is logged, and neither the others nor the engine
    thread stop."""
    for callback in callbacks:
        try:
            callback(value)
        except Exception:
            logger.exception("a callback for %s failed", what)


def _deliver(items: list[tuple[asyncio.Queue, StepDelta]]) -> None:
    for target, delta in items:
        target.put_nowait(delta)
