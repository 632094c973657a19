"""POST /tokenize and POST /detokenize, vLLM's: the server's tokenizer and chat rendering without the model.

`/tokenize` takes either a `prompt` (text, tokenized as /v1/completions tokenizes it: bos added unless
`add_special_tokens` is false or the text starts with one) or chat `messages` (rendered exactly as
/v1/chat/completions renders them, so `count` is that request's `usage.prompt_tokens`), and answers `count`,
`max_model_len`, `tokens` and `token_strs` (the vocabulary entries with `return_token_strs`, else null, as vLLM's
TokenizeResponse is sent).
`/detokenize` takes `tokens` and answers their text as `prompt`, special tokens kept (P-TOK-3).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from glimmer.cancellation import CancelToken
from glimmer.errors import RequestError
from glimmer.server.body import read_body
from glimmer.server.chat_prompt import build_chat_prompt, prompt_threads
from glimmer.server.completions import checked_token_ids, text_prompt_ids
from glimmer.server.context import ServingContext
from glimmer.server.schemas import ChatCompletionRequest, Items, RequestBody, parse_body, validate_json
from glimmer.server.streaming import in_worker_thread

CHAT_FIELDS = ("messages", "add_generation_prompt", "continue_final_message", "tools", "chat_template",
               "chat_template_kwargs", "mm_processor_kwargs")
"""The /tokenize fields that are /v1/chat/completions fields, rendered as that endpoint renders them."""


TOKENIZE_FIELD_HINTS = {"prompt": "must be a string: /tokenize takes one text prompt (send one request per text)"}
"""The completions hint (a prompt may be a string, a list of strings or token ids) told a client that sent a list of
strings that a list of strings was what it must send."""


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None  # with prompt: default true; with messages the template writes the bos
    return_token_strs: bool = False
    messages: Items[dict[str, Any]] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    tools: Items[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None  # vLLM's TokenizeChatRequest has it: {} alone, as chat takes it


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: Items[int]  # checked against the vocabulary by `_checked_tokens`, naming the id at fault


async def tokenize(raw_request: Request, context: ServingContext) -> Response:
    request = validate_json(TokenizeRequest, await read_body(raw_request, context),
                            TOKENIZE_FIELD_HINTS)
    context.check_model(request.model)
    token_ids = await in_worker_thread(raw_request, lambda cancel: _token_ids(request, context, cancel),
                                       prompt_threads(request.messages, context))
    strs = [context.tokenizer.id_to_token(token_id) for token_id in token_ids] if request.return_token_strs else None
    return JSONResponse({"count": len(token_ids), "max_model_len": context.engine.engine.max_model_len,
                         "tokens": token_ids, "token_strs": strs})


async def detokenize(raw_request: Request, context: ServingContext) -> Response:
    request = validate_json(DetokenizeRequest, await read_body(raw_request, context))
    context.check_model(request.model)
    tokens = _checked_tokens(request.tokens, context)
    return JSONResponse({"prompt": context.tokenizer.decode(tokens)})


def _token_ids(request: TokenizeRequest, context: ServingContext, cancel: CancelToken) -> list[int]:
    """Raises RequestError naming the field: both or neither of prompt and messages, a chat field beside a prompt,
    `add_special_tokens: true` with messages, a text too long for the context, or whatever chat refuses."""
    # null is unset, as on every route (schemas.drop_nulls keeps it only where None is a value): a `prompt: null` was
    # tokenized as "", and a client sending its unset fields as null was refused for giving both forms
    given = {name for name in request.model_fields_set if getattr(request, name) is not None}
    if ("prompt" in given) == ("messages" in given):
        raise RequestError("prompt, messages: give exactly one of them: `prompt` (text) or `messages` (a chat "
                           "conversation)", param="prompt" if "prompt" in given else "messages")
    if "prompt" in given:
        beside = next((name for name in CHAT_FIELDS if name in given), None)
        if beside is not None:
            raise RequestError(f"{beside}: a field of chat `messages`, not of a text `prompt`; leave it out or send "
                               "messages", param=beside)
        try:  # as /v1/completions reads the text, so that the counts agree
            return text_prompt_ids(request.prompt or "", request.add_special_tokens is not False, context)
        except RequestError as exc:
            raise exc.naming_prompt("prompt") from None
    if request.add_special_tokens:
        raise RequestError("add_special_tokens: the chat template writes the bos itself, so messages cannot take "
                           "another; leave add_special_tokens out or false", param="add_special_tokens")
    chat_fields = {name: getattr(request, name) for name in ("model", *CHAT_FIELDS) if name in given}
    chat_request = parse_body(ChatCompletionRequest, json.dumps(chat_fields).encode())
    return build_chat_prompt(chat_request, context, cancel).token_ids


def _checked_tokens(tokens: list[int], context: ServingContext) -> list[int]:
    """Raises RequestError naming `tokens[i]`, the first id outside the vocabulary, or `tokens` when there are more
    than max_model_len of them (no sequence the model reads or writes is longer)."""
    engine = context.engine.engine
    if len(tokens) > engine.max_model_len:
        raise RequestError(f"tokens: {len(tokens):,} token ids, more than max_model_len={engine.max_model_len}",
                           param="tokens")
    return checked_token_ids(tokens, "tokens", engine.token_count) if tokens else []
