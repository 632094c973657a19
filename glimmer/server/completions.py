"""POST /v1/completions: raw text in and out (special tokens kept, P-REQ-1), no chat template, no parsing.

A prompt is a string (bos added unless it starts with one or vLLM's `add_special_tokens` is false), token ids,
or a list of either (a batch; choice `i * n + j` is completion j of prompt i). `stop` strings go to the engine
and match the raw text; so does a structured-output constraint (`response_format`, `structured_outputs`,
`guided_*`).

Scoring: `echo` puts the prompt, as the model read it (with the bos Glimmer added to a text prompt), before
each choice's text; with `logprobs` its tokens come first in `logprobs`, the first with null logprobs since
nothing predicts it. `max_tokens: 0` scores the prompt without generating. vLLM's `prompt_logprobs: k`
adds each choice's `prompt_logprobs` in vLLM's shape.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from glimmer.cancellation import CancelToken
from glimmer.engine.beam_search import BeamSearchParams
from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.grammar import ControllerFactory
from glimmer.engine.multimodal_inputs import refuse_stray_placeholders
from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import RequestError
from glimmer.server.beam_search import beam_search_params, refuse_beam_search_options, run_beam_search
from glimmer.server.body import read_body
from glimmer.server.context import ServingContext
from glimmer.server.errors import describe_error
from glimmer.server.logprobs import completion_logprobs, vllm_prompt_logprobs
from glimmer.server.metrics import RequestTimer
from glimmer.server.request_id import client_request_id, engine_request_id
from glimmer.server.sampling import completion_sampling_params, with_default_max_tokens
from glimmer.server.schemas import CompletionRequest, chunk_usage, parse_body
from glimmer.server.settings import MAX_BATCH_PROMPTS
from glimmer.server.streaming import DONE_EVENT, SSEResponse, in_worker_thread, sse_event, until_disconnect
from glimmer.server.structured_outputs import requested_structured_outputs


@dataclass
class _Piece:
    """Text with the tokens it came from: their ids, logprob entries and where each token's text starts."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)


@dataclass
class _Choice:
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (vLLM's field)
    num_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)  # where each token's own text starts (`token_text_starts`)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    started: bool = False  # streaming: the first chunk (which carries the echo) was sent
    echo_chars: int = 0  # streaming: length of the echoed prompt that comes before `text`

    def add(self, delta: StepDelta) -> None:
        self.text_offsets.extend(delta.token_text_starts)
        self.logprobs.extend(delta.logprobs)
        self.text += delta.text
        self.num_tokens += len(delta.token_ids)
        self.num_cached_tokens = delta.num_cached_tokens
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs


@dataclass
class _CompletionRun:
    context: ServingContext
    request: CompletionRequest
    model_name: str
    prompts: list[list[int]]
    n: int
    choices: list[_Choice]
    timer: RequestTimer
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    # the usage's totals, kept as tokens arrive: with continuous_usage_stats every chunk carries the usage, and
    # summing it over all choices (up to MAX_BATCH_PROMPTS x max_n) took the event loop about 63 µs a chunk at 1,024
    prompt_tokens: int = field(init=False)
    completion_tokens: int = field(default=0, init=False)
    most_cached: list[int] = field(init=False)  # per prompt, the most any of its choices found cached

    def __post_init__(self) -> None:
        self.prompt_tokens = sum(map(len, self.prompts))
        self.most_cached = [0] * len(self.prompts)

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_name,
                "choices": choices}

    def detokenizer(self) -> IncrementalDetokenizer:
        """A fresh detokenizer that decodes as the engine does for this request (special tokens kept or skipped)."""
        skipped = frozenset(self.context.tokenizer.all_special_ids) if self.request.skip_special_tokens else frozenset()
        return IncrementalDetokenizer(self.context.tokenizer, skip_token_ids=skipped)

    def echo(self, index: int, prompt_logprobs: list[TokenLogprobs | None] | None) -> _Piece:
        """The echoed prompt of choice `index` (empty without `echo`), with its tokens' logprobs; the bytes of a
        character it leaves incomplete are the output text's (the engine's detokenizer starts on the prompt), but
        with max_tokens 0, where there is no output text, they end the echo as U+FFFD."""
        if not self.request.echo:
            return _Piece()
        ids = self.prompts[index // self.n]
        detokenizer = self.detokenizer()
        piece = _Piece(token_ids=ids, logprobs=list(prompt_logprobs or [None] * len(ids)))
        for token_id in ids:
            text, start = detokenizer.add_at(token_id)
            piece.text_offsets.append(len(piece.text) + start)
            piece.text += text
        if self.request.max_tokens == 0:
            piece.text += detokenizer.flush()
        return piece

    def choice(self, index: int, echo: _Piece, text: str, finish_reason: str | None, entries: list[TokenLogprobs],
               offsets: list[int], prompt_logprobs: list[TokenLogprobs | None] | None,
               stop_reason: int | str | None = None) -> dict[str, Any]:
        request = self.request
        logprobs = None
        if request.logprobs is not None:
            token_ids = echo.token_ids + [entry.token_id for entry in entries]
            shifted = echo.text_offsets + [len(echo.text) + offset for offset in offsets]
            logprobs = completion_logprobs(token_ids, echo.logprobs + list(entries), shifted,
                                           self.context.tokenizer, request.logprobs)
        choice = {"index": index, "text": echo.text + text, "logprobs": logprobs, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        if request.prompt_logprobs is not None and prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt_logprobs, self.context.tokenizer,
                                                             request.prompt_logprobs)
        return choice

    def add(self, index: int, delta: StepDelta) -> _Choice:
        """Adds `delta` to choice `index`, and its tokens to the usage; returns the choice."""
        choice = self.choices[index]
        choice.add(delta)
        self._count(index, len(delta.token_ids))
        return choice

    def append(self, choice: _Choice) -> None:
        """Adds a whole choice (beam search's), the next index, and its tokens to the usage."""
        self.choices.append(choice)
        self._count(len(self.choices) - 1, choice.num_tokens)

    def _count(self, index: int, new_tokens: int) -> None:
        self.completion_tokens += new_tokens
        first = index // self.n * self.n  # choices i*n .. i*n+n-1 complete prompt i
        self.most_cached[index // self.n] = max(c.num_cached_tokens for c in self.choices[first : first + self.n])

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": sum(self.most_cached)}}


def _prompts(prompt: str | list[str] | list[int] | list[list[int]], add_special_tokens: bool, params: SamplingParams,
             context: ServingContext, cancel: CancelToken) -> list[list[int]]:
    """Each prompt's token ids; raises RequestError naming the prompt of a batch (`prompt[1]`) or the token id
    (`prompt[0]`, `prompt[1][0]`) at fault. Each prompt also passes here the engine's checks of a prompt as it admits
    it (room for max_tokens, no media placeholders), so that none of a batch is admitted when one is refused: the
    prompts before it were prefilled for a 400 that waited for their first tokens, which /metrics counted."""
    if isinstance(prompt, list) and not prompt:
        raise RequestError("prompt: must not be empty", param="prompt")
    batch = _is_batch(prompt)
    prompts = prompt if batch else [prompt]
    if len(prompts) > MAX_BATCH_PROMPTS:
        raise RequestError(f"prompt: at most {MAX_BATCH_PROMPTS} prompts per request", param="prompt")
    engine = context.engine.engine
    ids = []
    for i, text_or_ids in enumerate(prompts):
        cancel.check()
        name = f"prompt[{i}]" if batch else "prompt"
        try:
            if isinstance(text_or_ids, str):
                ids.append(text_prompt_ids(text_or_ids, add_special_tokens, context,
                                           truncated=params.truncate_prompt_tokens is not None))
                if not ids[-1]:  # "" without the bos: the engine refused it only once the prompts before it ran
                    raise RequestError(f"{name}: must not be empty (add_special_tokens is false, so no bos is added "
                                       "to it); give it some text, or leave add_special_tokens true", param=name)
            else:
                ids.append(checked_token_ids(text_or_ids, name, engine.token_count))
            ids[-1], _ = engine.truncate_prompt(ids[-1], [], params)
            refuse_stray_placeholders(ids[-1], engine.media_token_ids)
            engine.generation_budget(len(ids[-1]), params)
        except RequestError as exc:
            raise exc.naming_prompt(name) from None
    return ids


def _is_batch(prompt: str | list[str] | list[int] | list[list[int]]) -> bool:
    """Whether `prompt` (not empty) is a list of prompts rather than one text or one list of token ids."""
    return isinstance(prompt, list) and not isinstance(prompt[0], int)


def text_prompt_ids(text: str, add_special_tokens: bool, context: ServingContext, *, truncated: bool = False
                    ) -> list[int]:
    """A text prompt's token ids: with the bos unless `add_special_tokens` is false or the text starts with one (a
    second bos silently alters the output, P-TMPL-5). Raises RequestError for a text the context cannot hold, before
    tokenizing it, unless `truncated` (truncate_prompt_tokens keeps its end: `LLMEngine.check_prompt_chars`)."""
    engine = context.engine.engine
    if add_special_tokens:
        return engine.encode_prompt(text, truncated=truncated)
    engine.check_prompt_chars(text, truncated=truncated)
    return context.tokenizer.encode_input_text(text)


def checked_token_ids(token_ids: list[int], name: str, vocabulary_size: int) -> list[int]:
    """`token_ids`, the prompt `name`; raises RequestError for an empty one or the first id outside the vocabulary
    (the engine's own check cannot say where it stands in the request)."""
    if not token_ids:
        raise RequestError(f"{name}: must not be empty", param=name)
    for position, token_id in enumerate(token_ids):
        if not 0 <= token_id < vocabulary_size:
            raise RequestError(f"{name}[{position}]: token id {token_id} is outside the vocabulary "
                               f"[0, {vocabulary_size})", param=f"{name}[{position}]")
    return list(token_ids)


def _controller_factory(request: CompletionRequest, context: ServingContext) -> ControllerFactory | None:
    """The raw text's grammar, compiled off the engine thread; RequestError naming the field if invalid."""
    structured, param = requested_structured_outputs(request)
    if structured is None:
        return None
    return context.grammars.structured_outputs(structured, param)


async def create_completion(raw_request: Request, context: ServingContext) -> Response:
    arrival = time.monotonic()
    request = parse_body(CompletionRequest, await read_body(raw_request, context))
    return await answer_completion(raw_request, context, request, arrival)


async def answer_completion(raw_request: Request, context: ServingContext, request: CompletionRequest,
                            arrival: float) -> Response:
    """The answer to `request`, read from `raw_request`'s body, which came at `arrival` (time.monotonic())."""
    model_name = context.check_model(request.model)
    client_id = client_request_id(raw_request, request.request_id)
    refuse_beam_search_options(request)
    beam = beam_search_params(request) if request.use_beam_search else None
    params = completion_sampling_params(request, context)
    try:
        prompts = await in_worker_thread(raw_request, lambda cancel: _prompts(
            request.prompt, request.add_special_tokens, params, context, cancel))
    except RequestError as exc:
        raise exc.naming_prompt("prompt") from None
    prompt_params = [with_default_max_tokens(params, context, len(ids)) for ids in prompts]
    run = _CompletionRun(context, request, model_name, prompts, params.n, [], RequestTimer(context.metrics, arrival))
    engine_id = run.id
    if client_id is not None:
        run.id = f"cmpl-{client_id}"
        engine_id = engine_request_id(run.id)
    if beam is not None:
        return await _beam_search_response(raw_request, run, engine_id, beam, prompt_params)
    factory = await in_worker_thread(raw_request, lambda cancel: _controller_factory(request, context))
    run.choices = [_Choice() for _ in range(len(prompts) * params.n)]
    # the queue limit counts this API request once, however many prompts it holds, before any is queued: prompts
    # queued beside a refused first one ran for nobody, and the 429 waited for their first tokens
    context.engine.check_queue_limit()
    updates = _merge([_naming_its_prompt(context.engine.generate(f"{engine_id}-{i}", ids, prompt_params[i],
                                                                 controller_factory=factory, queue_limit=False),
                                         f"prompt[{i}]" if _is_batch(request.prompt) else "prompt")
                      for i, ids in enumerate(prompts)], params.n)
    try:
        # the status waits for every prompt's first delta, or for the first prompt that fails: the others are then
        # aborted (their first tokens, waited for, came for nobody)
        begun = await until_disconnect(raw_request, _every_prompt_begun(updates, len(prompts), params.n))
    except BaseException:
        await updates.aclose()
        raise
    updates = _following(begun, updates)
    if request.stream:
        return SSEResponse(_stream(run, updates))
    return JSONResponse(await until_disconnect(raw_request, _collect(run, updates)))


async def _beam_search_response(raw_request: Request, run: _CompletionRun, engine_id: str, beam: BeamSearchParams,
                                prompt_params: list[SamplingParams]) -> Response:
    """The response of `use_beam_search`: prompt i's best beams as choices i * n + j, best first; streamed, each
    choice comes whole in one chunk once the search has ended (as vLLM streams them). `prompt_params`: each
    prompt's SamplingParams."""
    try:
        outputs, cached = await until_disconnect(raw_request, run_beam_search(run.context, engine_id, run.prompts,
                                                                               beam, prompt_params))
    except RequestError as error:
        raise error.naming_prompt("prompt") from None
    choices = []
    for number, output in enumerate(outputs):
        for rank, sequence in enumerate(output.sequences):
            index = number * run.n + rank
            detokenizer = run.detokenizer()
            # the text as a sampled choice's: the stop id that ended it included, as its special tokens are (P-REQ-1)
            text = "".join(detokenizer.add(entry.token_id) for entry in sequence.logprobs)
            run.append(_Choice(num_tokens=len(sequence.logprobs), num_cached_tokens=cached[number]))
            run.timer.tokens(len(sequence.logprobs))
            choices.append(run.choice(index, _Piece(), text + detokenizer.flush(), sequence.finish_reason, [], [],
                                      None, sequence.stop_reason))
    run.timer.done()
    if not run.request.stream:
        return JSONResponse({**run.envelope(choices), "usage": run.usage()})
    options = run.request.stream_options

    async def stream() -> AsyncIterator[str]:
        for choice in choices:
            yield sse_event({**run.envelope([choice]), **chunk_usage(options, run.usage)})
        if options is not None and options.include_usage:
            yield sse_event({**run.envelope([]), "usage": run.usage()})
        yield DONE_EVENT

    return SSEResponse(stream())


async def _collect(run: _CompletionRun, updates: AsyncIterator[tuple[int, StepDelta]]) -> dict[str, Any]:
    async with contextlib.aclosing(updates):
        async for index, delta in updates:
            run.timer.tokens(len(delta.token_ids))
            run.add(index, delta)
    run.timer.done()
    choices = [run.choice(i, run.echo(i, c.prompt_logprobs), c.text, c.finish_reason, c.logprobs, c.text_offsets,
                          c.prompt_logprobs, c.stop_reason)
               for i, c in enumerate(run.choices)]
    return {**run.envelope(choices), "usage": run.usage()}


async def _stream(run: _CompletionRun, updates: AsyncIterator[tuple[int, StepDelta]]) -> AsyncIterator[str]:
    options = run.request.stream_options
    include_usage = options is not None and options.include_usage
    async with contextlib.aclosing(updates):
        try:
            async for index, delta in updates:
                run.timer.tokens(len(delta.token_ids))
                choice = run.add(index, delta)
                echo = _Piece()
                if not choice.started:
                    echo = run.echo(index, delta.prompt_logprobs)
                    choice.started, choice.echo_chars = True, len(echo.text)
                # offsets count from the start of the choice's whole text, the echo included
                shift = choice.echo_chars - len(echo.text)
                offsets = [shift + offset
                           for offset in choice.text_offsets[len(choice.text_offsets) - len(delta.logprobs):]]
                chunk = run.envelope([run.choice(index, echo, delta.text, delta.finish_reason, delta.logprobs,
                                                 offsets, delta.prompt_logprobs, delta.stop_reason)])
                yield sse_event({**chunk, **chunk_usage(options, run.usage)})
            run.timer.done()
            if include_usage:
                yield sse_event({**run.envelope([]), "usage": run.usage()})
        except Exception as exc:  # the status line is sent: report the error as an event
            yield sse_event(describe_error(exc)[1])
    yield DONE_EVENT


def _coalesced(items: Iterable[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """`_merge`'s queued (prompt index, item) pairs with the deltas of each unfinished completion merged into its first:
    a client slower than the engine gets what queued up for it a chunk per completion (the pumps read every stream as
    it comes, so the engine's own coalescing never sees deltas wait). Ends of streams and errors keep their place."""
    out: list[tuple[int, Any]] = []
    unfinished: dict[tuple[int, int], int] = {}  # (prompt index, completion index) → its delta's place in `out`
    for prompt_index, item in items:
        if not isinstance(item, StepDelta):
            out.append((prompt_index, item))
            continue
        key = (prompt_index, item.index)
        at = unfinished.pop(key, None)
        if at is None:
            out.append((prompt_index, item))
            at = len(out) - 1
        else:
            out[at] = (prompt_index, out[at][1].merged(item))
        if item.finish_reason is None:
            unfinished[key] = at
    return out


async def _naming_its_prompt(stream: AsyncIterator[StepDelta], name: str) -> AsyncIterator[StepDelta]:
    """`stream`, whose RequestError names its prompt, `name` (`RequestError.naming_prompt`)."""
    async with contextlib.aclosing(stream):
        try:
            async for delta in stream:
                yield delta
        except RequestError as error:
            raise error.naming_prompt(name) from None


async def _every_prompt_begun(updates: AsyncIterator[tuple[int, StepDelta]], num_prompts: int,
                              n: int) -> list[tuple[int, StepDelta]]:
    """What `updates` gives until each of its prompts has given a delta; a prompt's failure is raised as it comes."""
    received: list[tuple[int, StepDelta]] = []
    begun: set[int] = set()
    while len(begun) < num_prompts:
        index, delta = await anext(updates)
        received.append((index, delta))
        begun.add(index // n)
    return received


async def _following(received: list[tuple[int, StepDelta]],
                     updates: AsyncIterator[tuple[int, StepDelta]]) -> AsyncIterator[tuple[int, StepDelta]]:
    """`received`, then the rest of `updates`; closing this closes `updates`."""
    async with contextlib.aclosing(updates):
        for item in received:
            yield item
        async for item in updates:
            yield item


async def _merge(streams: list[AsyncIterator[StepDelta]], n: int) -> AsyncIterator[tuple[int, StepDelta]]:
    """(choice index, delta) from every prompt's stream as they come, a stream's error raised as it comes; closing
    this closes them all."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(prompt_index: int, stream: AsyncIterator[StepDelta]) -> None:
        try:
            async for delta in stream:
                await queue.put((prompt_index, delta))
        except Exception as exc:
            await queue.put((prompt_index, exc))
        finally:
            await queue.put((prompt_index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        pending: collections.deque = collections.deque()
        while remaining:
            if not pending:  # everything that came since the last read, a completion's deltas as one
                pending.append(await queue.get())
                while not queue.empty():
                    pending.append(queue.get_nowait())
                pending = collections.deque(_coalesced(pending))
            prompt_index, item = pending.popleft()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield prompt_index * n + item.index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:  # a stream whose pump never ran is still open: closing it aborts its request
            await stream.aclose()
