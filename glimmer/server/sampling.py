"""OpenAI sampling fields → `SamplingParams` (which validates values and names the field at fault).

Fields a request leaves out take the checkpoint's `generation_config.json` value where it has one
(temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens as a chat request's max_tokens, and a
completion's with `max_tokens: null`) unless the engine's generation_config (AsyncEngine's, --generation-config) is
"vllm", else the OpenAI default (completions keep OpenAI's max_tokens default, 16).
Chat `stop` strings are not given to the engine: the server matches them against the answer text only (P-REQ-2, see
`choice_stream`).
"""

from __future__ import annotations

import copy

from glimmer.engine.sampling_params import (
    CHAT_ALLOWED_TOKEN_IDS_REFUSAL,
    MAX_LOGPROBS,
    SamplingParams,
)
from glimmer.errors import RequestError
from glimmer.server.context import ServingContext
from glimmer.server.schemas import ChatCompletionRequest, CompletionRequest
from glimmer.server.settings import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, STOP_STRINGS_SIZE_RULE


def stop_strings(request: ChatCompletionRequest | CompletionRequest) -> list[str]:
    """The request's stop strings; RequestError beyond MAX_STOP_STRINGS or MAX_STOP_STRING_CHARS."""
    stop = request.stop
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > MAX_STOP_STRINGS:
        raise RequestError(f"stop: {STOP_STRINGS_SIZE_RULE}", param="stop")
    for s in strings:
        if not s or len(s) > MAX_STOP_STRING_CHARS:
            raise RequestError(f"stop: each stop string must hold 1 to {MAX_STOP_STRING_CHARS} characters",
                               param="stop")
    return strings


def chat_sampling_params(request: ChatCompletionRequest, context: ServingContext) -> SamplingParams:
    max_tokens = request.max_completion_tokens
    if request.max_tokens is not None:
        if max_tokens is not None and max_tokens != request.max_tokens:
            raise RequestError("max_tokens and max_completion_tokens disagree; give one of them", param="max_tokens")
        max_tokens = request.max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise RequestError("max_tokens: must be at least 1 in a chat request (to score a prompt without generating, "
                           "use /v1/completions with echo and max_tokens 0)", param="max_tokens")
    logprobs = None
    if request.top_logprobs is not None:
        if not 0 <= request.top_logprobs <= MAX_LOGPROBS:
            raise RequestError(f"top_logprobs: must be between 0 and {MAX_LOGPROBS}", param="top_logprobs")
        # 0 asks for no alternatives, which a request without logprobs gets anyway (OpenAI and vLLM accept it)
        if request.top_logprobs > 0 and not request.logprobs:
            raise RequestError(f"top_logprobs: {request.top_logprobs} alternatives need logprobs; set logprobs to true "
                               "(or leave top_logprobs out)", param="top_logprobs")
    if request.logprobs:
        logprobs = request.top_logprobs or 0
    stop_strings(request)  # validated here, matched by the server against the answer
    if request.allowed_token_ids is not None:
        raise RequestError(CHAT_ALLOWED_TOKEN_IDS_REFUSAL.replace("LLM.generate or ", ""), param="allowed_token_ids")
    # P-REQ-1: the engine keeps special tokens, the framing the parser needs; the chat choice drops the others
    return _params(request, context, max_tokens=max_tokens, logprobs=logprobs, stop=[],
                   prompt_logprobs=request.prompt_logprobs, skip_special_tokens=False)


def apply_default_max_tokens(params: SamplingParams, context: ServingContext, prompt_len: int) -> None:
    """A request without max_tokens (chat's left out, or a completions prompt's null: `with_default_max_tokens`)
    stops at the checkpoint's `max_new_tokens` where it sets one, or where the context ends if that comes first (a
    default never turns a request into a 400: the request did not ask for it). Without the default it runs to the
    end of the context. A `min_tokens` the context cannot hold is left to the
    engine, which refuses it naming min_tokens (capping the default below it would blame a max_tokens never sent)."""
    checkpoint = context.engine.generation_config == "auto"
    default = context.engine.engine.generation_defaults.max_new_tokens if checkpoint else None
    room = context.engine.engine.max_model_len - prompt_len
    if params.max_tokens is None and default is not None and 1 <= room and params.min_tokens <= room:
        params.max_tokens = min(max(default, params.min_tokens), room)  # a request's min_tokens outranks a default


def with_default_max_tokens(params: SamplingParams, context: ServingContext, prompt_len: int) -> SamplingParams:
    """`params` for one prompt of a completions request: with `max_tokens: null` a copy whose max_tokens is the
    checkpoint's default for that prompt's length, as `apply_default_max_tokens` sets chat's (vLLM's get_max_tokens
    takes a null max_tokens as the generation config's, for each prompt); else `params` itself."""
    if params.max_tokens is not None:
        return params
    limited = copy.copy(params)  # only max_tokens differs between a batch's prompts
    apply_default_max_tokens(limited, context, prompt_len)
    return limited


def completion_sampling_params(request: CompletionRequest, context: ServingContext) -> SamplingParams:
    prompt_logprobs = request.prompt_logprobs
    if request.echo and request.logprobs is not None:  # the echoed prompt carries its logprobs too
        prompt_logprobs = max(prompt_logprobs or 0, request.logprobs)
    return _params(request, context, max_tokens=request.max_tokens, logprobs=request.logprobs,
                   stop=stop_strings(request), prompt_logprobs=prompt_logprobs,
                   skip_special_tokens=bool(request.skip_special_tokens))


def _params(request: ChatCompletionRequest | CompletionRequest, context: ServingContext, *,
            max_tokens: int | None, logprobs: int | None, stop: list[str], prompt_logprobs: int | None,
            skip_special_tokens: bool) -> SamplingParams:
    if not 1 <= request.n <= context.settings.max_n:
        raise RequestError(f"n: must be between 1 and {context.settings.max_n}", param="n")
    if request.cache_salt is None and context.settings.require_cache_salt:
        raise RequestError("cache_salt: this server requires a cache_salt on every request (a non-empty string; "
                           "only requests with the same salt share cached prompt blocks)", param="cache_salt")
    defaults = context.engine.engine.generation_defaults.sampling_defaults() if (
        context.engine.generation_config == "auto") else {}
    return SamplingParams(
        temperature=_first(request.temperature, defaults.get("temperature"), 1.0),
        top_p=_first(request.top_p, defaults.get("top_p"), 1.0),
        top_k=_first(request.top_k, defaults.get("top_k"), 0),
        min_p=_first(request.min_p, defaults.get("min_p"), 0.0),
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        stop=stop,
        stop_token_ids=request.stop_token_ids or [],
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=skip_special_tokens,
        prompt_logprobs=prompt_logprobs,
        ignore_eos=request.ignore_eos,
        seed=request.seed,
        logprobs=logprobs,
        presence_penalty=_first(request.presence_penalty, 0.0),
        frequency_penalty=_first(request.frequency_penalty, 0.0),
        repetition_penalty=_first(request.repetition_penalty, defaults.get("repetition_penalty"), 1.0),
        n=request.n,
        cache_salt=request.cache_salt,
        logit_bias=_logit_bias(request.logit_bias),
        allowed_token_ids=request.allowed_token_ids,
        truncate_prompt_tokens=request.truncate_prompt_tokens,
        bad_words=request.bad_words,
    )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's `logit_bias` (token ids as JSON object keys) keyed by int; SamplingParams checks the values (the
    schema has capped their count)."""
    if not bias:
        return None
    ids = {}
    keys: dict[int, str] = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 10:
            raise RequestError(f"logit_bias: key {key!r} is not a token id (a non-negative integer)",
                               param="logit_bias")
        token = int(key)
        if token in keys:  # "1" and "01": two JSON keys, one token; which bias counts would be a guess
            raise RequestError(f"logit_bias: keys {keys[token]!r} and {key!r} both name token {token}; give each "
                               "token once", param="logit_bias")
        keys[token] = key
        ids[token] = value
    return ids


def _first(*values):
    return next(value for value in values if value is not None)
