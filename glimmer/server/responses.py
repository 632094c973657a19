"""POST /v1/responses (and the routes of stored responses, `input_tokens` and `cancel`): the Responses API over the
chat machinery.

The request becomes a chat request (`responses_input`, `responses_schemas`): the same rendering, engine run,
parser and tool-choice checks as /v1/chat/completions (`chat.start_chat_run`, `chat.chat_updates`). The
parser's events, in wire order, drive one `OutputBuilder`: each reasoning message is a `reasoning` item (its
text in `content` as `reasoning_text`), each answer message a `message` item (`output_text`), each call a
`function_call` item. Streaming sends the builder's events as they happen (response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.*_text.delta / .done,
response.function_call_arguments.delta / .done, response.content_part.done, response.output_item.done,
then response.completed, or response.incomplete when max_output_tokens ran out); the non-streamed response
is the final snapshot of the same builder, so both agree.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from glimmer.engine.outputs import StepDelta
from glimmer.errors import RequestError
from glimmer.protocol.deltas import Event
from glimmer.protocol.reasoning_strength import TEMPLATE_DEFAULT_STRENGTH
from glimmer.server.body import read_body
from glimmer.server.chat import ChatRun, chat_updates, start_chat_run
from glimmer.server.chat_prompt import ResponsesTurn, build_chat_prompt, prompt_threads
from glimmer.server.choice_stream import Released, coalesced
from glimmer.server.context import ServingContext
from glimmer.server.errors import APIError, describe_error
from glimmer.server.request_id import response_id
from glimmer.server.response_store import ResponseStore, StoredResponse
from glimmer.server.responses_input import (
    MessageSource,
    chat_messages,
    continued_messages,
    images_read,
    input_items,
    responses_error,
    sealed_reasoning,
    with_sealed_reasoning,
)
from glimmer.server.responses_items import input_items_page, with_item_ids
from glimmer.server.responses_schemas import (
    ENCRYPTED_REASONING,
    OUTPUT_TEXT_LOGPROBS,
    REASONING_CONTEXT,
    REASONING_MODE,
    RESPONSES_FIELD_HINTS,
    InputTokensRequest,
    ResponsesRequest,
    chat_response_format,
    chat_tools,
    check_include,
    check_supported,
    reasoning_summary,
)
from glimmer.server.schemas import (
    DEFAULT_VERBOSITY,
    SERVED_SERVICE_TIER,
    ChatCompletionRequest,
    request_error,
    validate_json,
)
from glimmer.server.streaming import SSEResponse, in_worker_thread, sse_event, until_disconnect

_PASSED_THROUGH = ("model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed", "reasoning_strength", "chat_template_kwargs", "parallel_tool_calls",
                   "skip_special_tokens", "cache_salt")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class _Conversation:
    """The request's items after those of the response it continues, and the chat request they make."""

    items: list[dict[str, Any]]
    chat: ChatCompletionRequest
    sources: list[MessageSource]  # where each chat message came from, for errors naming the request's fields
    previous: StoredResponse | None = None  # the response continued, as read: its items are the first `continued`
    continued: int = 0


def _conversation(request: ResponsesRequest, store: ResponseStore) -> _Conversation:
    """Raises RequestError for an unknown previous response or anything the model cannot take."""
    check_supported(request)
    items = [_from_store(item, store, f"input[{i}]") for i, item in enumerate(input_items(request.input))]
    continued = 0  # items of the response continued, before the request's own input
    previous = None
    if request.previous_response_id == "":  # malformed, not a response that is gone: OpenAI's code for it
        raise RequestError("previous_response_id: an empty string names no response; leave the field out to start a "
                           "conversation, or send the id of the response to continue", param="previous_response_id",
                           code="empty_string")
    if request.previous_response_id is not None:
        previous = store.get(request.previous_response_id)
        if previous is None and store.in_progress(request.previous_response_id) is not None:
            raise RequestError(f"previous_response_id: the response {request.previous_response_id!r} is still being "
                               "generated; continue it once it has completed (after its stream's "
                               "response.completed event, or its JSON answer)", param="previous_response_id")
        if previous is None:  # OpenAI's code, which clients match to resend the whole conversation instead
            raise RequestError(f"previous_response_id: previous response {request.previous_response_id!r} not found "
                               "(never stored, expired, evicted or deleted; responses are kept in memory); send the "
                               "whole conversation as input instead", param="previous_response_id",
                               code="previous_response_not_found")
        if previous.response["status"] == "failed":  # its last item may be cut anywhere, a call's arguments too
            raise RequestError(f"previous_response_id: the response {request.previous_response_id!r} failed "
                               f"({previous.response['error']['message']}); continue the response before it, or "
                               "send the conversation as input", param="previous_response_id")
        items, continued = previous.rendered_items + items, len(previous.items)
    fields: dict[str, Any] = {name: getattr(request, name) for name in _PASSED_THROUGH
                              if getattr(request, name) is not None}
    sources: list[MessageSource] = []
    fields["messages"] = chat_messages(items, request.instructions, sources, continued,
                                       previous.items if previous is not None else None)
    if not fields["messages"]:
        raise RequestError("input: holds no message", param="input")
    if request.tools is not None:
        fields["tools"] = chat_tools(request.tools)
    choice = request.tool_choice
    if choice is not None:
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                         "function": {"name": choice.name}}
    if request.max_output_tokens is not None:
        fields["max_completion_tokens"] = request.max_output_tokens
    if OUTPUT_TEXT_LOGPROBS in (request.include or []):  # without it OpenAI returns none, whatever top_logprobs says
        fields["logprobs"] = True
        fields["top_logprobs"] = request.top_logprobs or 0
    response_format = chat_response_format(request)
    if response_format is not None:
        fields["response_format"] = response_format
    if request.reasoning is not None and request.reasoning.effort is not None:
        fields["reasoning_effort"] = request.reasoning.effort
    try:
        chat = ChatCompletionRequest.model_validate(fields, strict=False)
    except ValidationError as exc:
        raise responses_error(request_error(exc), sources) from None
    return _Conversation(items, chat, sources, previous, continued)


def _from_store(item: Any, store: ResponseStore, where: str) -> Any:
    """An input item as the store completes it: an `item_reference` is the stored item it names, a reasoning item sent
    back without its text gets the stored text of its id; any other item is returned as it is. Raises RequestError
    naming `where` (the item's place in the input) for an item the store cannot complete."""
    if isinstance(item, dict) and _is_reference(item):
        return _referenced_item(item, store, where)
    return _with_stored_reasoning(item, store, where)


def _is_reference(item: dict[str, Any]) -> bool:
    """An `item_reference` item: so typed, or an `id` alone (the SDK's ItemReference leaves its `type` optional)."""
    return item.get("type") == "item_reference" or {key for key, value in item.items() if value is not None} == {"id"}


def _referenced_item(reference: dict[str, Any], store: ResponseStore, where: str) -> dict[str, Any]:
    """The output item of a stored response that an `item_reference` names by its `id`, as OpenAI reads one: the
    Vercel AI SDK, while its `store` is true (its default), sends each item of the earlier turns it holds an id for
    (reasoning, an assistant message, a function call) as a reference alone. Raises RequestError naming `where` for a
    reference with another field, without a string id, or naming no stored output item (it would render as
    nothing)."""
    unknown = sorted(key for key, value in reference.items() if key not in ("type", "id") and value is not None)
    if unknown:
        raise RequestError(f"{where}.{unknown[0]}: unknown field of an item_reference item (it has `id` alone)",
                           param=f"{where}.{unknown[0]}")
    item_id = reference.get("id")
    if not isinstance(item_id, str) or not item_id:
        raise RequestError(f"{where}.id: an item_reference needs the id of a stored response's output item",
                           param=f"{where}.id")
    stored = store.output_item(item_id)
    if stored is None:
        raise RequestError(f"{where}.id: no stored response holds an output item {item_id!r} (never stored, store: "
                           "false, expired, evicted or deleted; responses are kept in memory); send the item itself "
                           "instead of a reference to it", param=f"{where}.id")
    return dict(stored)


def _with_stored_reasoning(item: Any, store: ResponseStore, where: str) -> Any:
    """A reasoning item sent back with no text (`content` and `summary` empty, no `encrypted_content`), filled with
    the text of the stored output item of its `id`, as OpenAI reads a stored item by its id: LangChain's stream
    builds a reasoning item from `response.output_item.added`, before its text, and sends it back so. Any other
    item is returned as it is. Raises RequestError naming `where` (the item's place in the input) for one whose id
    no stored response holds: it would render as no reasoning at all."""
    if not isinstance(item, dict) or item.get("type") != "reasoning" or not isinstance(item.get("id"), str) or any(
            item.get(name) for name in ("content", "summary", "encrypted_content")):
        return item
    stored = store.output_item(item["id"])
    if stored is None or stored.get("type") != "reasoning":
        raise RequestError(f"{where}: the reasoning item {item['id']!r} has no text (its content, summary and "
                           "encrypted_content are empty) and no stored response holds a reasoning item of that id "
                           "(never stored, store: false, expired, evicted or deleted; responses are kept in memory); "
                           "send its text in content, or leave the item out", param=where)
    return {**item, "content": stored["content"]}


_ITEM_CHANNELS = {"reasoning": "reasoning", "message": "content", "function_call": "tool"}
"""The parser's channel class (OpenChannel) of each output item type."""


@dataclass
class OutputBuilder:
    """Parser events → Responses output items, and the stream events that build them.

    With `include: ["message.output_text.logprobs"]` the answer's token logprobs (chat's `logprobs.content`
    entries) go with its text: each `response.output_text.delta` carries the entries decided since the last one,
    and the `output_text` part lists them all, so the deltas' entries add up to the part's. Entries decided while
    their text is still held back wait for the next delta of the answer; any left when the message item closes go
    in an empty delta before its `response.output_text.done`.

    With `summarize` (a request's `reasoning.summary`, "auto" or "detailed") a reasoning item's `summary` holds its
    text too, as one `summary_text` part streamed by the response.reasoning_summary_* events beside its content:
    the model's reasoning, whole, is the most detailed summary there is.

    With `seal_reasoning` (a request's `include: ["reasoning.encrypted_content"]`) a reasoning item closes with its
    text in `encrypted_content` too (`sealed_reasoning`): clients that store nothing replay only reasoning items that
    carry it (LangChain with `store=False` drops the others)."""

    items: list[dict[str, Any]] = field(default_factory=list)
    _open: dict[str, Any] | None = None  # the item being written
    _calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # parser call index → its item
    _pending_logprobs: list[dict[str, Any]] = field(default_factory=list)  # decided, not yet sent with a delta
    _reasoning_seen: bool = False  # reasoning text came before: a later reasoning message's text starts with "\n"
    summarize: bool = False
    seal_reasoning: bool = False

    def feed(self, events: list[Event], logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The stream events of the parser's `events`; `logprobs`: the answer's token entries they decided, which go
        with their answer text (not with the message a start in `events` closes before it)."""
        decided = logprobs or []
        out: list[dict[str, Any]] = []
        for kind, payload in events:
            # One token's logprobs go with its first content event: right while no token releases the text of two
            # messages, which only text held back for a possible stop string could, and /v1/responses takes no `stop`
            if kind == "content" and decided:
                self._pending_logprobs, decided = self._pending_logprobs + decided, []
            if kind == "tool_call":
                out += self._call(payload)
            elif kind == "message":
                out += self._message_start(payload)
            else:
                out += self._text(kind, payload)
        self._pending_logprobs += decided
        return out

    def finish(self, incomplete: bool = False, cut_channel: str | None = None) -> list[dict[str, Any]]:
        """Close the item being written: `incomplete` when max_output_tokens cut its message (as OpenAI marks the
        item the limit cut), which is when the parser's output ended inside a message of the item's own channel
        (`cut_channel`, OutputParser.channel_at_finish). An item whose message had ended before the cut (the cut
        fell in the next message's header, or in a call not yet emitted) is complete."""
        cut = incomplete and self._open is not None and _ITEM_CHANNELS[self._open["type"]] == cut_channel
        return self._close("incomplete" if cut else "completed")

    def fail(self) -> list[dict[str, Any]]:
        """Close the item being written as `incomplete`: the response failed before it ended (a failed response's
        items never stay `in_progress`, as an incomplete response's cut item is `incomplete`)."""
        return self._close("incomplete")

    def _index(self, item: dict[str, Any]) -> int:
        return self.items.index(item)

    def _message_start(self, channel: str) -> list[dict[str, Any]]:
        """A message of `channel` starts: the item of the message before it closes if it is of the same type, so that
        each message is an item of its own (two answers in a row rendered back as one would not be what the model
        wrote); its text then opens the next item."""
        if self._open is not None and _ITEM_CHANNELS[self._open["type"]] == channel:
            return self._close()
        return []

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        wanted = "reasoning" if kind == "reasoning" else "message"
        if self._open is None or self._open["type"] != wanted:
            out += self._close()
            out += self._start_text_item(wanted)
            if wanted == "reasoning" and self._reasoning_seen:
                # P-CHAN-4 joins the reasoning messages with a newline, sent with the next one's first text: chat's
                # one reasoning string needs it, an item of its own holds the message's text only
                text = text.removeprefix("\n")
        item = self._open
        part = item["content"][0]
        part["text"] += text
        if wanted == "reasoning":
            self._reasoning_seen = True
            if not text:
                return out
            out.append({"type": "response.reasoning_text.delta", "item_id": item["id"],
                        "output_index": self._index(item), "content_index": 0, "delta": text})
            if self.summarize:
                item["summary"][0]["text"] += text
                out.append({"type": "response.reasoning_summary_text.delta", "item_id": item["id"],
                            "output_index": self._index(item), "summary_index": 0, "delta": text})
            return out
        return [*out, self._answer_delta(item, text)]

    def _answer_delta(self, item: dict[str, Any], text: str) -> dict[str, Any]:
        """The output_text delta of `text`, carrying the logprobs decided so far (added to the part's)."""
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        item["content"][0]["logprobs"] += logprobs
        return {"type": "response.output_text.delta", "item_id": item["id"], "output_index": self._index(item),
                "content_index": 0, "delta": text, "logprobs": logprobs}

    def _start_text_item(self, kind: str) -> list[dict[str, Any]]:
        if kind == "reasoning":
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": _new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.items.append(item)
        self._open = item
        index = self._index(item)
        added = {"type": "response.output_item.added", "output_index": index, "item": _copy(item)}
        item["content"].append(part)
        part_added = {"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                      "content_index": 0, "part": _copy_part(part)}
        if kind != "reasoning" or not self.summarize:
            return [added, part_added]
        item["summary"].append({"type": "summary_text", "text": ""})
        return [added, part_added, {"type": "response.reasoning_summary_part.added", "item_id": item["id"],
                                    "output_index": index, "summary_index": 0, "part": dict(item["summary"][0])}]

    def _call(self, piece: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if piece.is_start:
            out += self._close()
            item = {"id": _new_id("fc"), "type": "function_call", "call_id": piece.id, "name": piece.name,
                    "arguments": "", "status": "in_progress"}
            self.items.append(item)
            self._open = self._calls[piece.index] = item
            out.append({"type": "response.output_item.added", "output_index": self._index(item), "item": _copy(item)})
        item = self._calls.get(piece.index)
        if item is None or not piece.arguments:
            return out
        item["arguments"] += piece.arguments
        return [*out, {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                       "output_index": self._index(item), "delta": piece.arguments}]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self._index(item)
        item["status"] = status
        if item["type"] == "reasoning" and self.seal_reasoning:
            item["encrypted_content"] = sealed_reasoning(item["content"][0]["text"])
        out: list[dict[str, Any]] = []
        if item["type"] == "function_call":
            out.append({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": index,
                        "name": item["name"], "arguments": item["arguments"]})
        else:
            part = item["content"][0]
            done_type = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            done = {"type": done_type, "item_id": item["id"], "output_index": index, "content_index": 0,
                    "text": part["text"]}
            if item["type"] == "message":
                if self._pending_logprobs:
                    out.append(self._answer_delta(item, ""))
                done["logprobs"] = list(part["logprobs"])
            out.append(done)
            out.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "part": _copy_part(part)})
            for summary in item.get("summary", []):
                out.append({"type": "response.reasoning_summary_text.done", "item_id": item["id"],
                            "output_index": index, "summary_index": 0, "text": summary["text"]})
                out.append({"type": "response.reasoning_summary_part.done", "item_id": item["id"],
                            "output_index": index, "summary_index": 0, "part": dict(summary),
                            **({"status": "incomplete"} if status == "incomplete" else {})})
        out.append({"type": "response.output_item.done", "output_index": index, "item": _copy(item)})
        return out


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    copied = {**item, **({"content": [_copy_part(part) for part in item["content"]]} if "content" in item else {})}
    return {**copied, **({"summary": [dict(part) for part in item["summary"]]} if "summary" in item else {})}


def _copy_part(part: dict[str, Any]) -> dict[str, Any]:
    return {**part, **({"logprobs": list(part["logprobs"])} if "logprobs" in part else {})}


@dataclass
class _ResponseRun:
    request: ResponsesRequest
    conversation: _Conversation
    chat: ChatRun
    store: ResponseStore
    builder: OutputBuilder = field(default_factory=OutputBuilder)
    id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    sequence_number: int = 0

    def snapshot(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        request, choice = self.request, self.chat.choices[0]
        done = status in ("completed", "incomplete")
        # a failed response lists what was streamed before the failure, as OpenAI's does
        listed = done or status == "failed"
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            # as OpenAI's: when the response completed, only for a completed one (not an incomplete or failed one)
            "completed_at": int(time.time()) if status == "completed" else None,
            "model": self.chat.model_name, "output": [_copy(item) for item in self.builder.items] if listed else [],
            "instructions": request.instructions, "previous_response_id": request.previous_response_id,
            "tools": request.tools or [], "tool_choice": _tool_choice(request),
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            # as OpenAI and vLLM echo them: the values sampled with (a field left out has the checkpoint's default)
            "temperature": self.chat.params.temperature, "top_p": self.chat.params.top_p,
            "max_output_tokens": request.max_output_tokens, "top_logprobs": request.top_logprobs or 0,
            "reasoning": {"effort": _reasoning_effort(request, self.chat.prompt.rendering.strength),
                          "summary": reasoning_summary(request), "context": REASONING_CONTEXT, "mode": REASONING_MODE},
            "text": _text_config(request), "truncation": "disabled",
            "store": request.store is not False,
            "metadata": request.metadata or {}, "user": request.user, "safety_identifier": request.safety_identifier,
            "prompt_cache_key": request.prompt_cache_key, "prompt_cache_retention": request.prompt_cache_retention,
            "prompt_cache_options": _prompt_cache_options(request),
            "service_tier": SERVED_SERVICE_TIER,
            "background": False, "max_tool_calls": request.max_tool_calls, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "usage": self.usage(choice) if done else None,
        }

    def usage(self, choice: Any) -> dict[str, Any]:
        prompt = len(self.chat.prompt.token_ids)
        return {"input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": choice.num_cached_tokens, "cache_write_tokens": 0},
                "output_tokens": choice.num_tokens,
                "output_tokens_details": {"reasoning_tokens": choice.reasoning_tokens},
                "total_tokens": prompt + choice.num_tokens}

    def answer_logprobs(self, step: Released) -> list[dict[str, Any]] | None:
        """The logprobs entries of the answer tokens `step` decided, if the request includes them."""
        logprobs = self.chat.logprobs(step.logprobs)
        return logprobs["content"] if logprobs is not None else None

    def final_status(self) -> str:
        self.chat.check_tool_choice(self.chat.choices[0], where="the response", limit_field="max_output_tokens")
        return "incomplete" if self.chat.choices[0].finish_reason == "length" else "completed"

    def close_output(self, status: str) -> list[dict[str, Any]]:
        """Close the output item being written (OutputBuilder.finish) for a response ending with `status`."""
        return self.builder.finish(incomplete=status == "incomplete",
                                   cut_channel=self.chat.choices[0].parser.channel_at_finish)

    def generating(self) -> contextlib.AbstractContextManager[None]:
        """Known to the store as in progress while the block runs, if it is to be stored (ResponseStore.generating)."""
        if self.request.store is False:
            return contextlib.nullcontext()
        return self.store.generating(self.id, lambda: self.snapshot("in_progress"))

    def keep(self, response: dict[str, Any]) -> dict[str, Any]:
        """`response`, stored if it is to be; where the store cannot hold it (ResponseStore.put), saying `store: false`,
        as a response not stored does: answered `store: true`, a GET and a continuation were 404 and
        previous_response_not_found without a word."""
        if self.request.store is False:
            return response
        conversation = self.conversation
        own = with_item_ids(conversation.items[conversation.continued:])  # ids they keep down the chain
        kept = self.store.put(self.id, own + response["output"], response, conversation.previous,
                              images_read=images_read(conversation.sources, self.chat.prompt.media_read))
        return response if kept else {**response, "store": False}

    def event(self, payload: dict[str, Any]) -> str:
        payload = {**payload, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return sse_event(payload, event=payload["type"])


_PROMPT_CACHE_DEFAULTS = {"mode": "implicit", "ttl": "30m"}  # OpenAI's defaults for the two a request leaves out


def _prompt_cache_options(request: ResponsesRequest) -> dict[str, Any] | None:
    """The `prompt_cache_options` echoed as the options applied, as the SDK's Response types them: `mode` and `ttl`
    are required there, so one a request left out is echoed at OpenAI's default; `comparison_response_id` as sent;
    `prewarm` was false or unset, and a response has none."""
    options = request.prompt_cache_options
    if options is None:
        return None
    return {**_PROMPT_CACHE_DEFAULTS, **options.model_dump(exclude_none=True, exclude={"prewarm"})}


def _text_config(request: ResponsesRequest) -> dict[str, Any]:
    """The `text` echoed: its `format` (`text` when none was sent) and its `verbosity`, "medium" (OpenAI's default,
    which OpenAI echoes when none was sent, and the only one taken: check_supported refuses the others)."""
    text = request.text or {}
    return {"format": text.get("format") or {"type": "text"}, "verbosity": DEFAULT_VERBOSITY}


def _reasoning_effort(request: ResponsesRequest, strength: str | None) -> str:
    """The `reasoning.effort` echoed, as OpenAI echoes a reasoning model's (its default too, never null): the one
    sent, else the strength the prompt was rendered with (`reasoning_strength`, `chat_template_kwargs`,
    `enable_thinking: false`, the server's default), else the template's own."""
    if request.reasoning is not None and request.reasoning.effort is not None:
        return request.reasoning.effort.lower()  # taken in any case (P-EFF-2); the SDK types it lower-case
    return strength or TEMPLATE_DEFAULT_STRENGTH


def _tool_choice(request: ResponsesRequest) -> Any:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


async def create_response(raw_request: Request, context: ServingContext) -> Response:
    arrival = time.monotonic()
    request = validate_json(ResponsesRequest, await read_body(raw_request, context),
                            RESPONSES_FIELD_HINTS)
    # off the event loop, as chat renders its prompt: checking a body's worth of tool schemas takes seconds
    named = response_id(raw_request, request.request_id)
    conversation = await in_worker_thread(raw_request, lambda cancel: _conversation(request, context.responses))
    turn = ResponsesTurn(continued_messages(conversation.sources), keep_media_read=request.store is not False,
                         response_id=named)
    try:
        chat, first, stream = await start_chat_run(raw_request, context, conversation.chat, arrival, turn)
    except RequestError as exc:  # raised naming chat fields: name the Responses request's own
        raise responses_error(exc, conversation.sources) from None
    summarize = reasoning_summary(request) is not None
    sealed = ENCRYPTED_REASONING in (request.include or [])
    run = _ResponseRun(request, conversation, chat, context.responses,
                       OutputBuilder(summarize=summarize, seal_reasoning=sealed), id=named)
    if request.stream:
        return SSEResponse(_stream(run, first, stream))
    return JSONResponse(await until_disconnect(raw_request, _collect(run, first, stream)))


async def count_input_tokens(raw_request: Request, context: ServingContext) -> Response:
    """POST /v1/responses/input_tokens (the SDK's `responses.input_tokens.count`): the tokens of the prompt a
    `POST /v1/responses` with these fields would render, its `usage.input_tokens`; refused as that request would be."""
    counted = validate_json(InputTokensRequest, await read_body(raw_request, context),
                            RESPONSES_FIELD_HINTS)
    request = validate_json(ResponsesRequest, json.dumps(counted.as_create_request()).encode())
    conversation = await in_worker_thread(raw_request, lambda cancel: _conversation(request, context.responses))
    context.check_model(request.model)
    turn = ResponsesTurn(continued_messages(conversation.sources))  # its prompt's: nothing is run or stored
    try:
        prompt = await in_worker_thread(raw_request,
                                        lambda cancel: build_chat_prompt(conversation.chat, context, cancel, turn),
                                        prompt_threads(conversation.chat.messages, context))
    except RequestError as exc:  # raised naming chat fields: name the Responses request's own
        raise responses_error(exc, conversation.sources) from None
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(prompt.token_ids)})


def get_response(response_id: str, raw_request: Request, context: ServingContext) -> Response:
    """GET /v1/responses/{id} (the SDK's `responses.retrieve`). Its `stream` and `starting_after` replay a background
    response's events, and Glimmer runs none: refused (400 naming them) rather than answered with the JSON object;
    `include` is checked as on create: `reasoning.encrypted_content` seals the reasoning items' text, as create does
    (output parts hold the logprobs they were made with)."""
    query = _query(raw_request, ("include", "stream", "starting_after", "include_obfuscation"))
    include = list(query.get("include", []))
    check_include(include)
    for name in ("stream", "include_obfuscation"):  # either case: Python's `requests` writes False as "False"
        if query.get(name, "false").lower() not in ("true", "false"):
            raise RequestError(f"{name}: {query[name]!r} is not a boolean (true or false)", param=name)
    for name in ("stream", "starting_after"):
        if query.get(name, "false").lower() != "false":
            raise RequestError(f"{name}: only background responses can be streamed again, and Glimmer runs none "
                               "(`background: true` is refused); retrieve the response without it, or stream it "
                               "when creating it", param=name)
    stored = context.responses.get(response_id)
    if stored is not None:
        response = stored.response
        if ENCRYPTED_REASONING in include:
            response = {**response, "output": [with_sealed_reasoning(item) for item in response["output"]]}
        return JSONResponse(response)
    in_progress = context.responses.in_progress(response_id)
    if in_progress is None:
        raise _not_stored(response_id)
    return JSONResponse(in_progress)  # as its response.created event showed it


def list_input_items(response_id: str, raw_request: Request, context: ServingContext) -> Response:
    """GET /v1/responses/{id}/input_items (the SDK's `responses.input_items.list`): a page of the items a stored
    response read (`responses_items`); 404 for one not stored."""
    query = _query(raw_request)
    stored = context.responses.get(response_id)
    if stored is None:
        _refuse_in_progress(response_id, context, "its input items are listed")
        raise _not_stored(response_id)
    return JSONResponse(input_items_page(stored.input_items, query))


def _query(raw_request: Request, known: tuple[str, ...] | None = None) -> dict[str, str | list[str]]:
    """The query parameters, `include` as a list (the SDK sends `include[]=...`); RequestError for another one
    given twice, or for one not `known` (where the route says which it takes; `()` for none)."""
    query: dict[str, str | list[str]] = {}
    for name, value in raw_request.query_params.multi_items():
        if name in ("include", "include[]"):
            query["include"] = [*query.get("include", []), value]
        elif name in query:
            raise RequestError(f"{name}: given more than once", param=name)
        else:
            query[name] = value
    unknown = sorted(set(query) - set(known)) if known is not None else []
    if unknown:
        takes = f"this route takes {', '.join(known)}" if known else "this route takes none"
        raise RequestError(f"{unknown[0]}: unknown query parameter ({takes})", param=unknown[0])
    return query


def cancel_response(response_id: str, raw_request: Request, context: ServingContext) -> Response:
    """POST /v1/responses/{id}/cancel: OpenAI cancels only responses created with `background: true`, which
    Glimmer refuses, so no response can be cancelled: 404 for one not stored, 400 for a stored one (it has
    finished). A response being generated stops when its client closes the connection. It takes no query
    parameter."""
    _query(raw_request, ())
    if context.responses.get(response_id) is None:
        if context.responses.in_progress(response_id) is not None:
            raise RequestError(f"response_id: {response_id!r} cannot be cancelled: only background responses can be, "
                               "and Glimmer runs none (`background: true` is refused); this response is being "
                               "generated: close its connection to stop it", param="response_id")
        raise _not_stored(response_id, "; one still being generated is stopped by closing its connection")
    raise RequestError(f"response_id: {response_id!r} cannot be cancelled: only background responses can be, and "
                       "Glimmer runs none (`background: true` is refused); this response has finished. To stop a "
                       "response while it is generated, close its connection", param="response_id")


def refuse_compaction() -> NoReturn:
    """POST /v1/responses/compact (the SDK's `responses.compact`, the OpenAI Agents SDK's compaction session): OpenAI
    shrinks a conversation into an opaque compaction item only its models read; Glimmer has no such item, so it
    refuses by name rather than with the bare 405 the route's absence gave."""
    raise RequestError("responses.compact: context compaction is not supported (nor `context_management`); send the "
                       "conversation as input items or continue it with previous_response_id, and keep it within the "
                       "model's context", param=None)


def delete_response(response_id: str, raw_request: Request, context: ServingContext) -> Response:
    """DELETE /v1/responses/{id}: forget a stored response, as OpenAI's API does; later requests naming it as
    `previous_response_id` are refused. It takes no query parameter (one misspelt or meant for another route is a
    400 before anything is deleted, as GET's and input_items' unknown ones are)."""
    _query(raw_request, ())
    if not context.responses.delete(response_id):
        _refuse_in_progress(response_id, context, "it can be deleted")
        raise _not_stored(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _not_stored(response_id: str, note: str = "") -> APIError:
    """The 404 for a response the store does not hold, with every reason it may not (GET named all but deleting)."""
    return APIError(404, f"no stored response {response_id!r} (never stored, expired, evicted or deleted{note})",
                    param="response_id", code="not_found")


def _refuse_in_progress(response_id: str, context: ServingContext, then: str) -> None:
    """RequestError for a response still being generated, saying that `then` once it has completed."""
    if context.responses.in_progress(response_id) is not None:
        raise RequestError(f"response_id: {response_id!r} is still being generated; {then} once it has completed",
                           param="response_id")


async def _collect(run: _ResponseRun, first: StepDelta, stream: AsyncIterator[StepDelta]) -> dict[str, Any]:
    with run.generating():
        async with contextlib.aclosing(stream):
            try:
                async for _, released in chat_updates(run.chat, first, stream):
                    for step in released:
                        run.builder.feed(step.events, run.answer_logprobs(step))
            except RequestError as exc:  # a constraint that failed while generating names the chat field
                raise responses_error(exc, run.conversation.sources) from None
        status = run.final_status()
        run.close_output(status)
        response = run.keep(run.snapshot(status))
        return response


async def _stream(run: _ResponseRun, first: StepDelta, stream: AsyncIterator[StepDelta]) -> AsyncIterator[str]:
    with run.generating():
        async with contextlib.aclosing(stream):
            yield run.event({"type": "response.created", "response": run.snapshot("in_progress")})
            yield run.event({"type": "response.in_progress", "response": run.snapshot("in_progress")})
            try:
                async for _, released in chat_updates(run.chat, first, stream):
                    for step in coalesced(released):
                        for event in run.builder.feed(step.events, run.answer_logprobs(step)):
                            yield run.event(event)
                status = run.final_status()
                for event in run.close_output(status):
                    yield run.event(event)
                response = run.keep(run.snapshot(status))
                yield run.event({"type": f"response.{status}", "response": response})
            except Exception as exc:  # the status line is sent: report the error as events
                if isinstance(exc, RequestError):  # a constraint that failed while generating names the chat field
                    exc = responses_error(exc, run.conversation.sources)
                http_status, body = describe_error(exc)
                error = body["error"]
                for event in run.builder.fail():
                    yield run.event(event)
                # the error's own code where it has one (`shutting_down`, as chat and completions streams report it)
                yield run.event({"type": "error", "code": error["code"] or error["type"], "message": error["message"],
                                 "param": error["param"]})
                # OpenAI's ResponseError codes: the request's own fault (a constraint its answer broke), or the
                # server's (a full queue, 429, is refused before the response is created)
                code = "invalid_prompt" if http_status == 400 else "server_error"
                failed = run.snapshot("failed", {"code": code,
                                                 "message": error["message"], "param": error["param"],
                                                 "type": error["type"]})
                # as OpenAI keeps it: its id came with response.created, and GET gives it failed
                failed = run.keep(failed)
                yield run.event({"type": "response.failed", "response": failed})
