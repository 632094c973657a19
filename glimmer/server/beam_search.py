"""vLLM's `use_beam_search: true` on /v1/completions and /v1/chat/completions: `n` is the beam width,
`length_penalty` ranks the results (see glimmer/engine/beam_search.py), and the n choices of a prompt are its best
beams, best first (a chat choice is its beam's turn, parsed as any reply).

The fields that shape sampling or the text a sampler may pick (penalties, filters, stop strings, a grammar, tools,
...) have no meaning in a search that ranks by the model's own logprobs: set to anything but their neutral value they
are refused naming them, where vLLM ignores them silently. A temperature is taken, as vLLM's beam search takes it, and
changes nothing (BeamSearchParams says why). Each step's beams run as one-token requests on
the engine, which the prefix cache shares the prompt with."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from glimmer.engine.async_engine import EngineDeadError, EngineStepError, FinishedCompletion
from glimmer.engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, warn_if_beams_recompute
from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.sequence import MultimodalItem
from glimmer.errors import RequestError
from glimmer.server.context import ServingContext
from glimmer.server.schemas import ChatCompletionRequest, CompletionRequest
from glimmer.server.structured_outputs import requested_structured_outputs

_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1), "top_k": (None, 0, -1), "min_p": (None, 0),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "repetition_penalty": (None, 1),
    "stop": (None, []), "min_tokens": (0,), "stop_token_ids": (None, []), "logit_bias": (None, {}),
    "allowed_token_ids": (None,), "bad_words": (None, []), "logprobs": (None, False), "prompt_logprobs": (None,),
    "echo": (False,), "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none", "auto"),
    "thinking_token_budget": (None,),
}
"""The fields beam search takes at these values only (those of either endpoint): it ranks candidates by the model's
own logprobs, which a filter, a penalty or a bias do not change; it ends a beam at the checkpoint's stop
ids only; it constrains nothing (no tools, no reasoning budget); and its choices carry no logprobs."""


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `neutral` (None and booleans by identity: false is no 0, nor 0.0 false)."""
    return any(value is allowed if allowed is None or isinstance(allowed, bool) else
               not isinstance(value, bool) and value == allowed for allowed in neutral)


def beam_search_params(request: CompletionRequest | ChatCompletionRequest) -> BeamSearchParams:
    """The request's BeamSearchParams (max_tokens 1 here: each prompt's budget is the search's own); RequestError
    naming the first field beam search cannot take, or a beam width (`n`) out of range."""
    for name, neutral in _NEUTRAL.items():
        if name in type(request).model_fields and not _is_neutral(getattr(request, name), neutral):
            raise RequestError(f"{name}: cannot be combined with use_beam_search (beam search ranks beams by the "
                               "model's own logprobs, ends them at the checkpoint's stop ids, and returns each "
                               "choice's text alone); leave it out, or drop use_beam_search", param=name)
    structured, param = requested_structured_outputs(request)
    if structured is not None:
        raise RequestError(f"{param}: cannot be combined with use_beam_search (a grammar decides which tokens may "
                           "follow, which a search over the model's most likely tokens does not ask); drop one",
                           param=param.split(".")[0])
    if request.early_stopping:
        raise RequestError("early_stopping: not supported: as vLLM's, beam search runs every beam to max_tokens or a "
                           "stop id; leave it out (or false)", param="early_stopping")
    if isinstance(request, CompletionRequest) and request.max_tokens == 0:
        raise RequestError("max_tokens: beam search generates at least one token; give max_tokens >= 1",
                           param="max_tokens")
    try:
        return BeamSearchParams(beam_width=request.n, max_tokens=1, ignore_eos=request.ignore_eos,
                                temperature=request.temperature or 0.0, length_penalty=request.length_penalty,
                                include_stop_str_in_output=request.include_stop_str_in_output)
    except RequestError as error:
        if error.param != "beam_width":
            raise
        raise RequestError(f"n: with use_beam_search n is the beam width, {str(error).split(': ', 1)[1]}",
                           param="n") from None


def refuse_beam_search_options(request: CompletionRequest | ChatCompletionRequest) -> None:
    """RequestError naming `length_penalty` or `early_stopping` set to a value that changes something without
    use_beam_search, which they are options of."""
    if request.use_beam_search:
        return
    for name, neutral in (("length_penalty", 1), ("early_stopping", False)):
        if getattr(request, name) != neutral:
            raise RequestError(f"{name}: an option of beam search; set use_beam_search: true with it, or leave it "
                               "out", param=name)


async def run_beam_search(context: ServingContext, run_id: str, prompts: list[list[int]], params: BeamSearchParams,
                          generations: list[SamplingParams], multimodal: list[MultimodalItem] | None = None
                          ) -> tuple[list[BeamSearchOutput], list[int]]:
    """Search every prompt's beams (`generations`: each prompt's SamplingParams, for its budget and the request's
    cache salt; `multimodal`: the media of a single prompt); returns each prompt's best beams and its cached prompt
    tokens (as its first step read them). The engine's statistics count the search as its prompts and their beam_width
    completions each (`_SearchClock`), not as the one-token requests its steps run."""
    engine = context.engine.engine
    stop_ids = params.stop_ids(engine.generation_defaults.stop_token_ids)
    searches = [BeamSearch(ids, params, stop_ids, engine.generation_budget(len(ids), generation))
                for ids, generation in zip(prompts, generations, strict=True)]
    # the queue limit counts this API request once, before any beam is queued: a search is refused whole or runs to
    # its end (beams queued beside a refused first one were added past the limit, to be aborted)
    context.engine.check_queue_limit()
    warn_if_beams_recompute(engine)  # after: a refused search warns of nothing
    step_params = params.step_params(generations[0].cache_salt)
    cached = [0] * len(prompts)
    clocks = [_SearchClock() for _ in prompts]
    step = 0
    try:
        while not all(search.done for search in searches):
            stepping = [(number, search.live_beams()) for number, search in enumerate(searches) if not search.done]
            streams = [context.engine.generate(f"{run_id}-{step}-{number}-{i}", beam, step_params,
                                               multimodal=multimodal, queue_limit=False, generated=step, counted=False)
                       for number, live in stepping for i, beam in enumerate(live)]
            results = iter(await _all_next_tokens(streams))
            now = time.time()
            for number, live in stepping:
                entries = [next(results) for _ in live]
                if step == 0:
                    cached[number] = entries[0].cached_tokens
                    clocks[number].first_scheduled_time = entries[0].first_scheduled_time
                clocks[number].step_times.append(now)
                searches[number].advance([entry.logprobs for entry in entries])
            step += 1
    except BaseException as error:
        # a search refused at its first step (a prompt too long) never ran: as a refused request, not counted
        if step or not isinstance(error, RequestError):
            reason = "error" if isinstance(error, (EngineStepError, EngineDeadError)) else "abort"
            beams = [_beams(_results(context, search)) if search.done else [(reason, search.steps)] * params.beam_width
                     for search in searches]
            _record(context, prompts, beams, clocks)
        raise
    outputs = [_results(context, search) for search in searches]
    _record(context, prompts, [_beams(output) for output in outputs], clocks)
    return outputs, cached


def _results(context: ServingContext, search: BeamSearch) -> BeamSearchOutput:
    return search.results(context.tokenizer, context.tokenizer.eos_token_id)


def _beams(output: BeamSearchOutput) -> list[tuple[str, int]]:
    """A finished search's best beams as (finish reason, tokens)."""
    return [(sequence.finish_reason, len(sequence.logprobs)) for sequence in output.sequences]


@dataclass
class _SearchClock:
    """When one prompt's search was first scheduled, and when each of its steps' tokens came (wall-clock times)."""

    arrival: float = field(default_factory=time.time)
    first_scheduled_time: float | None = None
    step_times: list[float] = field(default_factory=list)

    def finished(self, reason: str, num_prompt_tokens: int, num_tokens: int) -> FinishedCompletion:
        """A beam of `num_tokens` tokens, as a completion the engine ran alone would be recorded."""
        times = self.step_times[:num_tokens]
        return FinishedCompletion.timed(reason, num_prompt_tokens, num_tokens, self.arrival, self.first_scheduled_time,
                                        times[0] if times else None, times[-1] if times else None)


def _record(context: ServingContext, prompts: list[list[int]], beams: list[list[tuple[str, int]]],
            clocks: list[_SearchClock]) -> None:
    """Count the search in the engine's statistics: each prompt once, and per prompt its beams as (finish reason,
    tokens)."""
    context.engine.record_finished(sum(map(len, prompts)), [
        clock.finished(reason, len(prompt), num_tokens)
        for prompt, prompt_beams, clock in zip(prompts, beams, clocks, strict=True)
        for reason, num_tokens in prompt_beams])


async def _all_next_tokens(streams: list[AsyncIterator[StepDelta]]) -> list[_StepResult]:
    """Each stream's `_next_token`. When one fails (a prompt refused as too long, a failed step), the others are
    stopped, and their requests aborted, before the error is raised: they would otherwise run for nobody."""
    tasks = [asyncio.ensure_future(_next_token(stream)) for stream in streams]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass
class _StepResult:
    logprobs: TokenLogprobs  # the one token's entry, its candidates in `top`
    cached_tokens: int  # prompt tokens read from the prefix cache
    first_scheduled_time: float | None


async def _next_token(stream: AsyncIterator[StepDelta]) -> _StepResult:
    """A one-token request's logprobs entry, how many of its prompt tokens it read from the prefix cache, and when it
    was scheduled."""
    entries: list[TokenLogprobs] = []
    cached = 0
    scheduled = None
    async with contextlib.aclosing(stream):
        async for delta in stream:
            entries += delta.logprobs
            cached = delta.num_cached_tokens
            scheduled = scheduled or delta.first_scheduled_time
    return _StepResult(entries[0], cached, scheduled)
