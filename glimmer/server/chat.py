"""POST /v1/chat/completions: render, generate, parse, and answer as one JSON body or as an SSE stream.

Both shapes come from the same loop over the engine's deltas (`_updates`), so the concatenated stream equals
the non-streaming response, ids aside (P-API-4). Errors before the first token (invalid request, overload)
are HTTP statuses; after it, a streaming response can only report them as an error event.

vLLM's `echo` puts the final message's text before each choice's when that message is the assistant's, as the
response's message is (`echoed`): in the content for an answer, in the reasoning for a message to `self`; streamed, as
one chunk per choice after the role chunks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from glimmer.cancellation import CancelToken
from glimmer.engine.call_length import fewest_call_tokens
from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import ContextLengthError, ForcedCallContextError, RequestError
from glimmer.protocol import ParsedOutput, assistant_message, stream_delta_objects
from glimmer.protocol.deltas import Delta, Event
from glimmer.protocol.headers import channel_of_recipient
from glimmer.protocol.request_normalization import TEXT_PART_TYPES
from glimmer.server.beam_search import beam_search_params, refuse_beam_search_options, run_beam_search
from glimmer.server.body import read_body
from glimmer.server.chat_prompt import ChatPrompt, ResponsesTurn, build_chat_prompt, prompt_parts, prompt_threads
from glimmer.server.choice_stream import ChoiceStream, Released, coalesced
from glimmer.server.context import ServingContext
from glimmer.server.errors import describe_error
from glimmer.server.logprobs import chat_logprobs, vllm_prompt_logprobs
from glimmer.server.metrics import RequestTimer
from glimmer.server.request_id import client_request_id, engine_request_id
from glimmer.server.sampling import apply_default_max_tokens, chat_sampling_params, stop_strings
from glimmer.server.schemas import SERVED_SERVICE_TIER, ChatCompletionRequest, chunk_usage, parse_body
from glimmer.server.streaming import DONE_EVENT, SSEResponse, in_worker_thread, sse_event, until_disconnect

logger = logging.getLogger(__name__)


@dataclass
class ChatRun:
    """One chat request on its way through the engine: what the chat and Responses endpoints share."""

    context: ServingContext
    request: ChatCompletionRequest
    prompt: ChatPrompt
    model_name: str
    choices: list[ChoiceStream]
    timer: RequestTimer
    params: SamplingParams  # what the engine runs: the request's fields, the checkpoint's defaults for the rest
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    engine_id: str = ""  # the engine's id of the request: `id`, made unique where the client chose it (request_id.py)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    def check_tool_choice(self, choice: ChoiceStream, *, where: str | None = None,
                          limit_field: str | None = None) -> None:
        """P-REQ-4: raises ToolChoiceUnsatisfiedError for a choice that a required or named tool_choice needed a
        call in and that ended without one (cut short by the token limit, `limit_field`: by default the chat field
        the request set). `where` names the reply in the message (by default "choice N")."""
        if limit_field is None:
            limit_field = token_limit_field(self.request)
        max_model_len = self.context.engine.engine.max_model_len
        context_full = len(self.prompt.token_ids) + choice.num_tokens >= max_model_len
        error = self.prompt.tools.unsatisfied(choice.parser.valid_call_names, choice.finish_reason,
                                              where=where or f"choice {choice.index}", limit_field=limit_field,
                                              context_full_at=max_model_len if context_full else None)
        if error is not None:
            self.context.metrics.tool_choice_unsatisfied.inc()
            raise error

    def logprobs(self, entries: list[TokenLogprobs]) -> dict[str, Any] | None:
        """`logprobs` of a choice or chunk: `entries` are the answer's tokens (`ChoiceStream.content_logprobs`)."""
        return chat_logprobs(entries, self.context.tokenizer) if self.request.logprobs else None

    def usage(self) -> dict[str, Any]:
        completion = sum(choice.num_tokens for choice in self.choices)
        prompt = len(self.prompt.token_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": max(choice.num_cached_tokens for choice in self.choices)},
            "completion_tokens_details": {"reasoning_tokens": sum(c.reasoning_tokens for c in self.choices)},
        }

    def vllm_prompt_logprobs(self) -> dict[str, Any]:
        """`{"prompt_logprobs": [...]}` in vLLM's shape when the request asked for them, else {}."""
        k = self.request.prompt_logprobs
        if k is None or self.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(self.prompt_logprobs, self.context.tokenizer, k)}

    def chunk(self, index: int, delta: dict[str, Any], *, logprobs: dict[str, Any] | None = None,
              finish_reason: str | None = None, extra: dict[str, Any] | None = None,
              extra_choice: dict[str, Any] | None = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        chunk: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model_name,
            "service_tier": SERVED_SERVICE_TIER, "choices": [{**choice, **(extra_choice or {})}], **(extra or {}),
            **chunk_usage(self.request.stream_options, self.usage),
        }
        return sse_event(chunk)

    @property
    def include_usage(self) -> bool:
        options = self.request.stream_options
        return options is not None and options.include_usage


@dataclass(frozen=True)
class Echo:
    """What vLLM's `echo` puts before each choice's text: `text` in the field of `channel` ("content" or
    "reasoning")."""

    channel: str
    text: str

    def apply(self, message: dict[str, Any]) -> None:
        """Prepend the echo to a response `message` (`assistant_message`'s)."""
        if self.channel == "content":
            message["content"] = self.text + (message["content"] or "")
        else:  # the reasoning under both its names
            message["reasoning_content"] = message["reasoning"] = self.text + (message["reasoning_content"] or "")

    def delta(self) -> dict[str, Any]:
        """The streamed chunk's delta that carries the echo."""
        if self.channel == "content":
            return {"content": self.text}
        return {"reasoning_content": self.text, "reasoning": self.text}


def echoed(request: ChatCompletionRequest) -> Echo | None:
    """What vLLM's `echo` puts before each choice's text: the final message's text when its role is the response's,
    `assistant` (a continued message's, say), in the field where that message's text belongs: the content for an
    answer (no recipient, or `user`), the reasoning for a message to `self` (§2.1; continued, its reply is read as the
    rest of it, P-TMPL-8), when the request includes reasoning. A message to a tool is a call (continued, it comes back
    whole as the reply's call): not echoed. Content parts' texts are joined by newlines, as vLLM joins them."""
    final = request.messages[-1]
    if not request.echo or final.get("role") != "assistant":
        return None
    channel = channel_of_recipient(final.get("recipient") or None)
    if channel == "tool" or (channel == "reasoning" and not request.include_reasoning):
        return None
    content = final.get("content")
    if isinstance(content, list):
        text = "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES
                         and isinstance(part.get("text"), str))
    else:
        text = content if isinstance(content, str) else ""
    return Echo("content" if channel == "content" else "reasoning", text) if text else None


async def create_chat_completion(raw_request: Request, context: ServingContext) -> Response:
    arrival = time.monotonic()
    request = parse_body(ChatCompletionRequest, await read_body(raw_request, context))
    return await answer_chat_completion(raw_request, context, request, arrival)


async def answer_chat_completion(raw_request: Request, context: ServingContext, request: ChatCompletionRequest,
                                 arrival: float) -> Response:
    """The answer to `request`, read from `raw_request`'s body, which came at `arrival` (time.monotonic())."""
    refuse_beam_search_options(request)
    start = start_beam_search_run if request.use_beam_search else start_chat_run
    run, first, stream = await start(raw_request, context, request, arrival)
    if request.stream:
        return SSEResponse(_stream(run, first, stream))
    return JSONResponse(await until_disconnect(raw_request, _collect(run, first, stream)))


def token_limit_field(request: ChatCompletionRequest) -> str:
    """The field the request set its token limit in: max_completion_tokens where it gave only that."""
    only_completion = request.max_tokens is None and request.max_completion_tokens is not None
    return "max_completion_tokens" if only_completion else "max_tokens"


_MAX_TOKENS = re.compile(r"(?<![\w.])max_tokens(?!\w)")


def limit_named_as_sent(error: RequestError, request: ChatCompletionRequest) -> RequestError | None:
    """`error` of SamplingParams or the engine, which call the token limit max_tokens, naming the field the request
    set it in instead; None where it already does."""
    limit_field = token_limit_field(request)
    if limit_field == "max_tokens" or not (error.param == "max_tokens" or _MAX_TOKENS.search(str(error))):
        return None
    param = limit_field if error.param == "max_tokens" else error.param
    return error.with_message(_MAX_TOKENS.sub(limit_field, str(error)), param)


def _forced_call(prompt: ChatPrompt, context: ServingContext) -> tuple[str, int] | None:
    """What a required or named `tool_choice` asks for, in words, and the fewest tokens of any reply holding it
    (`fewest_call_tokens`); None where tool_choice forces no call."""
    tools = prompt.tools
    if tools.required_names is None:
        return None
    allowed = [tool for tool in tools.parser_tools or () if tool["function"]["name"] in tools.required_names]
    what = f"a call of {allowed[0]['function']['name']!r}" if len(allowed) == 1 else "a tool call"
    return what, fewest_call_tokens(allowed, context.tokenizer)


def _check_room_for_the_forced_call(request: ChatCompletionRequest, forced: tuple[str, int] | None) -> None:
    """RequestError naming the request's token limit when it is below the fewest tokens of any reply holding a call
    that a required or named `tool_choice` allows (`_forced_call`): every such reply would be cut short without the
    call, a 500 once generated (P-REQ-4)."""
    limit = request.max_tokens if request.max_tokens is not None else request.max_completion_tokens
    if limit is None or forced is None:
        return
    what, fewest = forced
    if limit < fewest:
        field = token_limit_field(request)
        raise RequestError(f"{field}: {limit} tokens cannot hold {what}, which tool_choice asks for: the shortest "
                           f"takes {fewest} tokens (its header and ATEM tags, values empty); raise {field} to at "
                           f"least {fewest}, more for the reasoning and the values", param=field)


def _check_context_holds_the_forced_call(prompt: ChatPrompt, forced: tuple[str, int] | None,
                                         max_model_len: int) -> None:
    """ForcedCallContextError when the prompt fits the context but leaves less of it than the fewest tokens of any
    reply holding the call a required or named `tool_choice` asks for (`_forced_call`): without a token limit, the
    reply would run to the end of the context without the call, a 500 once generated (P-REQ-4)."""
    room = max_model_len - len(prompt.token_ids)
    if forced is None or room < 1 or room >= forced[1]:  # a prompt the context cannot hold: the engine's refusal
        return
    raise ForcedCallContextError(max_model_len, len(prompt.token_ids), *forced)


@contextlib.contextmanager
def _limit_named_as_sent(request: ChatCompletionRequest) -> Iterator[None]:
    """A RequestError raised inside, naming the token limit as the request set it (`limit_named_as_sent`)."""
    try:
        yield
    except RequestError as error:
        renamed = limit_named_as_sent(error, request)
        if renamed is None:
            raise
        raise renamed from error


async def _prepared_run(raw_request: Request, context: ServingContext, request: ChatCompletionRequest, arrival: float,
                        choices: Callable[[ChatPrompt, SamplingParams], list[ChoiceStream]],
                        turn: ResponsesTurn | None = None) -> ChatRun:
    """The run of a chat request, rendered and truncated, named by the client's request id where it sent one (the
    engine's id then unique to it: requests in flight may share the client's); `turn`: what a /v1/responses request
    adds (`ResponsesTurn`), whose response id then names the engine's request instead."""
    model_name = context.check_model(request.model)
    named_for = turn.response_id if turn is not None else None
    client_id = client_request_id(raw_request, request.request_id) if named_for is None else None
    with _limit_named_as_sent(request):
        params = chat_sampling_params(request, context)
    def build(cancel: CancelToken) -> tuple[ChatPrompt, tuple[str, int] | None]:
        # off the event loop: counting a forced call's tokens takes a while
        prompt = build_chat_prompt(request, context, cancel, turn)
        forced = _forced_call(prompt, context)
        _check_room_for_the_forced_call(request, forced)
        return prompt, forced

    prompt, forced = await in_worker_thread(raw_request, build, prompt_threads(request.messages, context))
    engine = context.engine.engine
    rendered_len = len(prompt.token_ids)
    # vLLM's truncate_prompt_tokens keeps the rendered prompt's end, the generation prompt the reply is parsed after
    prompt.token_ids, prompt.multimodal = engine.truncate_prompt(prompt.token_ids, prompt.multimodal, params)
    apply_default_max_tokens(params, context, len(prompt.token_ids))
    _check_context_holds_the_forced_call(prompt, forced, engine.max_model_len)  # a truncated prompt's room
    try:  # the engine refuses a prompt the context cannot hold too; here the refusal says what made it long
        with _limit_named_as_sent(request):
            engine.generation_budget(len(prompt.token_ids), params)
    except ContextLengthError as error:
        if len(prompt.token_ids) != rendered_len:  # truncated: its parts are no longer the request's
            raise
        parts = await in_worker_thread(raw_request,
                                       lambda cancel: prompt_parts(request.messages, prompt, context, turn))
        with _limit_named_as_sent(request):
            raise error.naming(parts) from None
    run = ChatRun(context, request, prompt, model_name, choices(prompt, params), RequestTimer(context.metrics, arrival),
                  params)
    if named_for is not None:
        run.engine_id = engine_request_id(named_for)
    elif client_id is None:
        run.engine_id = run.id
    else:
        run.id = f"chatcmpl-{client_id}"
        run.engine_id = engine_request_id(run.id)
    return run


async def start_chat_run(raw_request: Request, context: ServingContext, request: ChatCompletionRequest,
                         arrival: float, turn: ResponsesTurn | None = None
                         ) -> tuple[ChatRun, StepDelta, AsyncIterator[StepDelta]]:
    """Render, submit and wait for the first delta. Raises before any output: an invalid request (400), an
    overloaded or stopped engine, or a client that left (the request is then aborted). `turn`: what a /v1/responses
    request adds (`ResponsesTurn`); its choices' events mark where each reasoning or content message starts
    (OutputParser's `mark_messages`), each message an output item of the response."""
    stop = stop_strings(request)
    hidden = frozenset() if request.skip_special_tokens is False else context.hidden_special_tokens

    def choices(prompt: ChatPrompt, params: SamplingParams) -> list[ChoiceStream]:
        return [ChoiceStream(i, prompt.tools.parser_tools, stop=stop, single_call=request.parallel_tool_calls is False,
                             include_stop=request.include_stop_str_in_output, hidden_tokens=hidden,
                             min_tokens=params.min_tokens, verbatim_content=prompt.constrained_answer,
                             continue_recipient=prompt.continue_recipient, continue_prefix=prompt.continue_prefix,
                             mark_messages=turn is not None)
                for i in range(params.n)]

    run = await _prepared_run(raw_request, context, request, arrival, choices, turn)
    prompt = run.prompt
    stream = context.engine.generate(run.engine_id, prompt.token_ids, run.params, multimodal=prompt.multimodal,
                                     controller_factory=prompt.controller_factory, hidden_token_ids=hidden)
    try:
        first = await until_disconnect(raw_request, anext(stream))
    except BaseException as error:
        await stream.aclose()
        renamed = limit_named_as_sent(error, request) if isinstance(error, RequestError) else None
        if renamed is None:
            raise
        raise renamed from error
    if first.prompt_logprobs is not None and request.prompt_logprobs is not None:
        run.prompt_logprobs = first.prompt_logprobs
    return run, first, stream


async def start_beam_search_run(raw_request: Request, context: ServingContext, request: ChatCompletionRequest,
                                arrival: float) -> tuple[ChatRun, StepDelta, AsyncIterator[StepDelta]]:
    """`start_chat_run` for `use_beam_search` (server/beam_search.py): render, search, and hand over each of the best
    beams, best first, as one whole delta of its choice, which is read as any reply is."""
    beam = beam_search_params(request)
    run = await _prepared_run(raw_request, context, request, arrival, lambda prompt, params: [])
    prompt, params = run.prompt, run.params
    with _limit_named_as_sent(request):
        outputs, cached = await until_disconnect(raw_request, run_beam_search(
            context, run.engine_id, [prompt.token_ids], beam, [params], prompt.multimodal))
    hidden = frozenset() if request.skip_special_tokens is False else context.hidden_special_tokens
    deltas = []
    for rank, sequence in enumerate(outputs[0].sequences):
        run.choices.append(ChoiceStream(rank, prompt.tools.parser_tools, stop=[], hidden_tokens=hidden,
                                        single_call=request.parallel_tool_calls is False,
                                        continue_recipient=prompt.continue_recipient,
                                        continue_prefix=prompt.continue_prefix))
        token_ids = [entry.token_id for entry in sequence.logprobs]  # the turn as generated, its stop id included
        detokenizer = IncrementalDetokenizer(context.tokenizer, skip_token_ids=hidden)
        pieces = [detokenizer.add(token_id) for token_id in token_ids]
        pieces[-1] += detokenizer.flush()
        # where each token's text ends: the choice reads the turn token by token, as it reads a generated one
        deltas.append(StepDelta(run.id, rank, token_ids, "".join(pieces), finish_reason=sequence.finish_reason,
                                stop_reason=sequence.stop_reason, num_prompt_tokens=len(prompt.token_ids),
                                num_cached_tokens=cached[0], token_text_ends=list(itertools.accumulate(map(len,
                                                                                                        pieces)))))

    async def the_others() -> AsyncIterator[StepDelta]:
        for delta in deltas[1:]:
            yield delta

    return run, deltas[0], the_others()


async def chat_updates(run: ChatRun, first: StepDelta,
                       stream: AsyncIterator[StepDelta]) -> AsyncIterator[tuple[ChoiceStream, list[Released]]]:
    """Each engine delta as (its choice, what it released token by token), until every choice is done."""
    delta: StepDelta | None = first
    while delta is not None:
        choice = run.choices[delta.index]
        if not choice.done:
            run.timer.tokens(len(delta.token_ids))
            released = choice.feed(delta)
            if choice.done and delta.finish_reason is None:  # the server ended it (stop string, P-HDR-8, ...)
                run.context.engine.abort(run.engine_id, index=choice.index, reason="stop")
            if choice.done and choice.parser.unresolved_call_count:
                run.context.metrics.unresolved_tool_calls.inc(choice.parser.unresolved_call_count)
            yield choice, released
        if all(choice.done for choice in run.choices):
            break
        delta = await anext(stream, None)
    run.timer.done()


async def _collect(run: ChatRun, first: StepDelta, stream: AsyncIterator[StepDelta]) -> dict[str, Any]:
    events: dict[int, list[Event]] = {choice.index: [] for choice in run.choices}
    async with contextlib.aclosing(stream):
        async for choice, released in chat_updates(run, first, stream):
            events[choice.index].extend(event for step in released for event in step.events)
    include_reasoning = run.request.include_reasoning
    echo = echoed(run.request)
    response_choices = []
    for choice in run.choices:
        run.check_tool_choice(choice)
        parsed = ParsedOutput.from_deltas([Delta.from_events(events[choice.index])])
        message = assistant_message(parsed, include_reasoning=include_reasoning)
        if echo is not None:
            echo.apply(message)
        response_choices.append({
            "index": choice.index,
            "message": message,
            "logprobs": run.logprobs(choice.content_logprobs),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        })
    response = {"id": run.id, "object": "chat.completion", "created": run.created, "model": run.model_name,
                "service_tier": SERVED_SERVICE_TIER, "choices": response_choices, "usage": run.usage()}
    return {**response, **run.vllm_prompt_logprobs()}


async def _stream(run: ChatRun, first: StepDelta, stream: AsyncIterator[StepDelta]) -> AsyncIterator[str]:
    # The prompt's cached tokens are known at admission and come with its first delta, read before any chunk is
    # sent: the role (and echo) chunks' usage (continuous_usage_stats) counts them, as every later chunk does.
    run.choices[first.index].num_cached_tokens = first.num_cached_tokens
    async with contextlib.aclosing(stream):
        try:
            for choice in run.choices:
                yield run.chunk(choice.index, {"role": "assistant"},
                                extra=run.vllm_prompt_logprobs() if choice.index == 0 else None)
            echo = echoed(run.request)
            if echo is not None:
                for choice in run.choices:
                    yield run.chunk(choice.index, echo.delta())
            async for choice, released in chat_updates(run, first, stream):
                for step in coalesced(released):
                    for chunk in _step_chunks(run, choice, step):
                        yield chunk
                if choice.done:
                    run.check_tool_choice(choice)
                    # a choice with no answer token streamed none: its last chunk carries the empty list the
                    # non-streamed choice answers, so a client adding the chunks up reads `logprobs.content` alike
                    unanswered = run.logprobs([]) if not choice.content_logprobs else None
                    yield run.chunk(choice.index, {}, logprobs=unanswered, finish_reason=choice.finish_reason,
                                    extra_choice={"stop_reason": choice.stop_reason})
            if run.include_usage:
                yield sse_event({"id": run.id, "object": "chat.completion.chunk", "created": run.created,
                                 "model": run.model_name, "service_tier": SERVED_SERVICE_TIER, "choices": [],
                                 "usage": run.usage()})
        except Exception as exc:  # the status line is sent: report the error as an event (P-REQ-4)
            yield sse_event(describe_error(exc)[1])
    yield DONE_EVENT


def _step_chunks(run: ChatRun, choice: ChoiceStream, step: Released) -> list[str]:
    """The chunks of one piece of what `choice` released (`coalesced`): one per event (P-API-3). The logprobs of the
    answer tokens it decided go with its first content chunk, which carries their text; where that text is held
    back (a possible stop string), in an empty-delta chunk of their own."""
    objects = stream_delta_objects(Delta.from_events(step.events), include_reasoning=run.request.include_reasoning)
    logprobs = run.logprobs(step.logprobs) if step.logprobs else None
    carrier = next((i for i, obj in enumerate(objects) if "content" in obj), None)
    if logprobs is not None and carrier is None:
        objects.append({})
        carrier = len(objects) - 1
    return [run.chunk(choice.index, obj, logprobs=logprobs if position == carrier else None)
            for position, obj in enumerate(objects)]
